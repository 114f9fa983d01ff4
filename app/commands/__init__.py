"""One module per CLI command: pull (models, pull), check, plan, doctor, equivalence (verify),
bench, serve, up (up, run), dashboard (dash); `common` holds what they share.

May import every folder (the commands put the pieces together); nothing imports them but app/cli.py.
"""
