"""Planning a run: which (dp, tp, pp, micro-batch) layouts fit a model on a cluster, and how fast.

planner.py        memory per GPU, compute, communication and bubble of every layout (the formulas
                  and their sources in its docstring); `minipar plan`
step_messages.py  the messages of one training step of the tiny GPT on a mesh, as sent
plan_table.py     the planner's layouts as a table (`minipar plan`, lesson 08)

Light to import: no torch (measuring a model's compute loads it, inside the function).
"""
