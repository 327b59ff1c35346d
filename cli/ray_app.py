"""``sf-trt serve --ray`` as a Ray Serve application builder, for Ray's own CLI and KubeRay:

    serve run sf_trt.cli.ray_app:app_builder flags="--replicas 2 --max-num-seqs 8"

and in a ``serveConfigV2`` / Serve config file: ``import_path: sf_trt.cli.ray_app:app_builder``
with ``args: {flags: "..."}``. The flags are ``sf-trt serve --ray``'s, checked as the command
checks them; the cluster's address and the proxy's host and port belong to Ray's config.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Sequence

from . import build_parser
from .errors import CliError
from .serve_ray import resolve_ray_flags

__all__ = ["app_builder", "parse_ray_flags"]


def parse_ray_flags(flags: Sequence[str]) -> argparse.Namespace:
    """``sf-trt serve --ray FLAGS`` parsed and resolved."""
    for own in ("--host", "--port", "--ray-address"):
        if any(f == own or f.startswith(own + "=") for f in flags):
            raise CliError(f"{own}: set by Ray Serve's config (http_options, the cluster), not by the application's flags")
    try:
        args = build_parser().parse_args(["serve", "--ray", *flags])
    except SystemExit as exc:
        raise CliError(f"bad sf-trt serve flags {' '.join(flags)!r} (see sf-trt serve --help)") from exc
    return resolve_ray_flags(args)


def app_builder(builder_args: dict):
    """The application of ``builder_args["flags"]`` (Ray calls this with the config's ``args``)."""
    from .ray_deployment import build_app

    return build_app(parse_ray_flags(shlex.split(str(builder_args.get("flags", "")))))
