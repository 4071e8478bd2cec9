"""``mlcpack-run``: the runtime's own command line, for machines that only run bundles.

It has ``mlcpack``'s ``infer``, ``inspect``, ``verify`` and ``bench`` with the same options, output
and exit codes (both call ``runtime/commands.py``), but uses argparse from the standard library:
typer, rich and the compiler are not runtime dependencies.

    mlcpack-run infer model.mlc image.png
    python -m mlcpack.runtime.cli inspect model.mlc --json
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn, Sequence

from . import commands

PROG = "mlcpack-run"


class _Parser(argparse.ArgumentParser):
    """Usage mistakes are one line on stderr and exit 2, as everywhere in mlcpack."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} -h)\n")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="the .mlc bundle")
    p.add_argument("--debug", action=argparse.BooleanOptionalAction, default=False,
                   help="show tracebacks")


def _command(sub: argparse._SubParsersAction, name: str, fn: Callable[[argparse.Namespace], None],
             summary: str, example: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=summary, description=summary,
                       epilog=f"example: {PROG} {example}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.set_defaults(run=fn)
    return p


def _infer(a: argparse.Namespace) -> None:
    commands.infer(a.bundle, a.inputs, top_k=a.top_k, as_json=a.json, threads=a.threads,
                   trusted_keys=a.trusted_key, strict=a.strict, output=a.output,
                   fail_fast=a.fail_fast, resume=a.resume, ray=a.ray, workers=a.workers,
                   batch_size=a.batch_size)


def _inspect(a: argparse.Namespace) -> None:
    commands.inspect(a.bundle, ir=a.ir, as_json=a.json)


def _verify(a: argparse.Namespace) -> None:
    commands.verify(a.bundle, rtol=a.rtol, atol=a.atol, threads=a.threads)


def _bench(a: argparse.Namespace) -> None:
    commands.bench(a.bundle, runs=a.runs, threads=a.threads, budget_s=a.budget, as_json=a.json,
                   profile=a.profile, trace=a.trace, top=a.top, shapes=a.shape)


def parser() -> argparse.ArgumentParser:
    """The ``mlcpack-run`` argument parser (one sub-command per runtime command)."""
    top = _Parser(prog=PROG, description="Run, inspect, verify and time mlcpack .mlc bundles "
                  "(the runtime alone: numpy and msgpack, no compiler).")
    top.add_argument("--version", action="version",
                     version=f"{PROG} (mlcpack-runtime {commands.version()})")
    sub = top.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)

    p = _command(sub, "infer", _infer, commands.INFER_HELP, commands.INFER_EXAMPLE)
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="image (PNG/JPEG, needs Pillow) or .npy tensor, one per model input; "
                   "or, for a one-input bundle, many files, folders or globs")
    p.add_argument("-k", "--top-k", type=int, default=5, help="how many classes to print "
                   "(default 5)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--threads", type=int, default=None,
                   help="threads (default MLCPACK_NUM_THREADS or 1)")
    p.add_argument("--trusted-key", action="append", default=[], metavar="KEY.pub",
                   help="run only if signed by this Ed25519 public key (PEM); repeatable")
    p.add_argument("--strict", action="store_true", help=commands.STRICT_HELP)
    p.add_argument("-o", "--output", default=None, metavar="FILE", help=commands.OUTPUT_HELP)
    p.add_argument("--fail-fast", action="store_true", help=commands.FAIL_FAST_HELP)
    p.add_argument("--resume", action="store_true", help=commands.RESUME_HELP)
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help=commands.BATCH_SIZE_HELP)
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help=commands.RAY_HELP)
    p.add_argument("--workers", type=int, default=None, metavar="N", help=commands.WORKERS_HELP)

    p = _command(sub, "inspect", _inspect, commands.INSPECT_HELP, commands.INSPECT_EXAMPLE)
    p.add_argument("--ir", action="store_true",
                   help="print the IRModule the bundle was built from")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")

    p = _command(sub, "verify", _verify, commands.VERIFY_HELP, commands.VERIFY_EXAMPLE)
    p.add_argument("--rtol", type=float, default=None,
                   help="override the recorded relative tolerance")
    p.add_argument("--atol", type=float, default=None,
                   help="override the recorded absolute tolerance")
    p.add_argument("--threads", type=int, default=None,
                   help="threads (default MLCPACK_NUM_THREADS or 1)")

    p = _command(sub, "bench", _bench, commands.BENCH_HELP, commands.BENCH_EXAMPLE)
    p.add_argument("--runs", type=int, default=None,
                   help="timed runs (default: as many as fit in --budget)")
    p.add_argument("--threads", type=int, default=1, help="threads for parallel kernels")
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds of timed runs when --runs is not given (default 1)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--profile", action="store_true", help="time every kernel: mean/min us, "
                   "share, GFLOP/s and the source ONNX nodes, slowest first")
    p.add_argument("--trace", default=None, metavar="FILE", help="write a Chrome trace-event "
                   "JSON (Perfetto, chrome://tracing); implies --profile")
    p.add_argument("--top", type=int, default=30, metavar="N",
                   help="kernels in the --profile table (0: all; default 30)")
    p.add_argument("--shape", action="append", default=None, metavar="NAME=DIMS",
                   help="an input's shape (repeatable): the sizes a bundle with symbolic "
                   "shapes is timed at (default: every size variable 1)")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command; return its exit code."""
    top = parser()
    args = top.parse_args(argv)
    if not hasattr(args, "run"):
        top.print_help()
        return 2
    return commands.guarded(lambda: args.run(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
