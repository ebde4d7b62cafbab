"""The course: what a student runs, does and is graded on, beside the library it teaches.

lessons/     each lesson's runnable half (`minipar lesson NN`; the texts are lessons/*.md)
demos/       small rank programs the tour runs (`-m minipar.course.demos.ring_shift`)
exercises.py exercises/ generated from solutions/, and `register()` for a student's algorithms
gradebook.py points and the Gradescope / JUnit reports of `minipar grade`
stepdiff.py  a failed exercise explained: the first step where it parts from the solution
whose.py     inputs that say whose data an element holds

Light to import: a command imports only the module it needs.
"""
