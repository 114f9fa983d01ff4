"""`specdeck plan`: the memory plan of a preset, from local headers or the hub's."""

from __future__ import annotations

import argparse
import json

from app.commands.common import (
    catalog_from_args,
    make_fetcher,
    make_selection,
    model_info,
    out,  # noqa: E402
    plan_request,
    projector,
)
from app.drafting.kinds import rows_of
from app.plan.hardware import detect
from app.plan.planner import make_plan
from app.plan.view import render_plan


def cmd_plan(args: argparse.Namespace) -> int:
    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    fetcher = make_fetcher(args.offline)
    target = model_info(fetcher, sel.target)
    draft = model_info(fetcher, sel.draft) if sel.draft else None
    req = plan_request(args)
    plan = make_plan(target, draft, req, detect(), sel.context, head=rows_of(sel), projector=projector(fetcher, sel, target))
    if args.json:
        out.print_json(json.dumps(plan.to_json()))
    else:
        out.print(render_plan(plan, sel.name))
    return 0
