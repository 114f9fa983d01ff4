"""The memory plan: hardware, memory terms, the planner, the plan's table."""
