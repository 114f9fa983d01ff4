"""`specdeck kube`: the Kubernetes objects one replica per GPU needs, planned as `serve` plans
(the same start request: selection, --model NAME=..., --ctx, the config file), printed as YAML or
written one file per object (-o DIR). `--litellm HOST ...` prints LiteLLM's proxy config instead."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path

from app.commands.common import (
    catalog_of,
    config_path,
    make_fetcher,
    model_info,
    out,
    projector,
    roles_of,
    selection_of,
    serve_settings,
)
from app.commands.start_request import NamedModel, StartRequest, served
from app.drafting.kinds import head_of
from app.errors import SpecdeckError
from app.kube.manifests import NAME_RE, Replica, Served, dump, file_name, litellm_config, objects
from app.plan.hardware import detect
from app.plan.planner import make_plan

# ServeSettings that name files or addresses of this machine, not the pod's (the manifests set their own)
LOCAL_ONLY = {"api_key", "api_key_file", "host", "port", "tls_cert", "tls_key", "chat_template_file", "access_log",
              "shutdown_grace", "request_timeout"}


def selection_args(named: NamedModel) -> list[str]:
    """The selection as `specdeck pull` and `serve` take it in the pod."""
    c = named.chosen
    args = [c.name] if c.name else []
    for flag, value in (("--target", c.target), ("--draft", c.draft), ("--mmproj", c.mmproj)):
        if value:
            args += [flag, value]
    return args + (["--no-mmproj"] if c.no_mmproj else [])


def planned(named: NamedModel, req: StartRequest, hw, offline: bool) -> Served:
    """One model planned from its headers (on disk, else the hub's), as `serve` would plan it; its
    files must be catalogue models, which the pod pulls and verifies by SHA-256."""
    settings = req.settings
    catalog = catalog_of(named.chosen.models)
    sel = selection_of(named.chosen, catalog)
    refs = roles_of(sel, named.chosen, settings.speculative, catalog)
    for _, ref in refs:
        if ref.spec is None or ref.spec.sha256 is None:
            raise SpecdeckError(f"{ref.label}: the pod pulls and verifies its models by SHA-256, so they must be "
                                "catalogue models or presets (a file of this machine cannot be pulled there)",
                                hint="add it to your models.toml with its sha256, or name a preset")
    fetcher = make_fetcher(offline)
    target = model_info(fetcher, sel.target)
    draft = model_info(fetcher, sel.draft) if sel.draft and settings.speculative else None
    head = head_of(sel, settings.speculative)
    asked = req.model_plan_request(named, draft_max=settings.draft_max)
    plan = make_plan(target, draft, asked, hw, sel.context, head=head.rows if head else None,
                     projector=projector(fetcher, sel, target))
    if not plan.fits:
        raise SpecdeckError(f"{named.name or sel.name} does not fit the memory planned for ({plan.budget_source})",
                            hint="plan for the node: --vram 24GiB (a card) or --ram 32GiB (a CPU node); or a smaller --ctx")
    return Served(name=named.name or sel.name, selection=selection_args(named) or [sel.name], plan=plan.to_json(),
                  file_bytes=sum(ref.spec.size or 0 for _, ref in refs),
                  plan_flags=["--ctx", str(plan.ctx), "--parallel", str(plan.parallel)])


def replica(args: argparse.Namespace) -> Replica:
    settings = serve_settings(args, check=False)
    req = StartRequest.of(args, settings, config=config_path(args))
    image = args.image or ""
    if "@sha256:" not in image:
        raise SpecdeckError("--image must name the image by digest (REPOSITORY@sha256:DIGEST), so every replica runs "
                            "the same bytes", hint="bash scripts/container.sh build prints the digest it built")
    if settings.api_key_file is None:
        raise SpecdeckError("kube needs --api-key-file: the pod listens beyond loopback, so its API needs keys "
                            "(the file goes into the Secret)")
    try:
        keys = Path(settings.api_key_file).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecdeckError(f"cannot read {settings.api_key_file}: {e.strerror or e}") from None
    for value, what in ((args.object_name, "--name"), (args.namespace, "--namespace")):
        if not NAME_RE.match(value) or len(value) > 50:
            raise SpecdeckError(f"{what} {value!r}: lowercase letters, digits and '-', at most 50 (a Kubernetes name)")
    if not 1 <= args.replicas <= args.max_replicas:
        raise SpecdeckError(f"--replicas {args.replicas} and --max-replicas {args.max_replicas}: need 1 <= replicas <= max")
    hw = detect()
    models = [planned(named, req, hw, args.offline) for named in served(req)]
    serve = {k: v for k, v in settings.model_dump(mode="json", exclude_defaults=True).items() if k not in LOCAL_ONLY}
    return Replica(name=args.object_name, namespace=args.namespace, image=image, models=models, keys=keys,
                   metrics_token=secrets.token_urlsafe(24), serve=serve, request_timeout=settings.request_timeout,
                   replicas=args.replicas, max_replicas=args.max_replicas, prometheus=args.prometheus,
                   storage_class=args.storage_class, several=bool(req.models))


def cmd_kube(args: argparse.Namespace) -> int:
    if args.litellm:
        print(litellm_config(args.litellm, args.litellm_model), end="")
        return 0
    objs = objects(replica(args))
    if args.output is None:
        print(dump(objs), end="")
        return 0
    folder = Path(args.output)
    folder.mkdir(parents=True, exist_ok=True)
    for o in objs:
        (folder / file_name(o)).write_text(dump([o]), encoding="utf-8")
    out.print(f"wrote {len(objs)} objects to {folder}: kubectl apply -f {folder}")
    return 0
