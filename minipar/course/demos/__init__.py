"""Rank-side demos: small programs that run on every rank under `minipar run`.

    minipar run -n 2 -m minipar.course.demos.ping_pong
    minipar run -n 4 -m minipar.course.demos.ring_shift
    minipar run -n 4 -m minipar.course.demos.all_reduce
    minipar run -n 2 -m minipar.course.demos.smoke          (what `minipar doctor` launches)

Every rank does the work; rank 0 gathers what the others saw and prints it, the rest stay quiet.
`minipar tour` runs them one after another.
"""
