"""The memory plan: hardware, memory terms, the planner, the plan's table. Pure arithmetic on GGUF
metadata and the machine's figures.

May import: app.gguf, app.llama (the parameters a plan fixes), app.build (the build's extra CPU
buffers), app.errors, app.units.
"""
