"""The command line of ``python -m onnxruntime_ep_mlu.regression``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .. import _repo_root, get_library_path
from ._checker import PATHS
from ._frames import (
    _read_zoo,
    dataset_frames,
    default_zoo,
    generated_frames,
    load_dataset_models,
    load_reference,
    load_zoo,
    write_frames,
)
from ._runs import run_in_process, run_ray, summarize


# ============================================================================ command line
class _Parser(argparse.ArgumentParser):
    """Every user error as one line that names what to pass (argparse's own errors start
    with a usage block; a wrong file or folder would otherwise end in a traceback)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return value


def main(argv=None) -> int:
    ap = _Parser(
        prog="python -m onnxruntime_ep_mlu.regression",
        description="Model-level regression over a dataset of frames (CPU path and MLUExecutionProvider), "
        "in this process or on Ray.",
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--frames", metavar="DIR", help="frame folder: DIR/<model>/<frame>.npz (in.<input>, optional out.<output>)")
    src.add_argument("--generate", type=_positive, metavar="N", help="N generated frames per zoo model (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated frames (default 0)")
    ap.add_argument("--reference", default=None, metavar="FILE.py",
                    help="a Python file defining goldens(model, inputs) -> {output: array}, independent of this "
                         "library: the goldens of generated frames 1.. (default: the CPU path's result)")
    ap.add_argument("--limit", type=_positive, default=None, help="at most this many frames per model of --frames")
    ap.add_argument("--models", default=None, help="comma-separated subset of the models")
    ap.add_argument("--zoo", default=None, help="zoo.json (default: the zoo packaged with this module, onnxruntime_ep_mlu.zoo())")
    ap.add_argument("--paths", default="cpu,mlu", help="cpu, mlu or both (default)")
    ap.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=True,
                    help="the MLU path on the emulated card (default) or, --no-emulate, on real cards")
    ap.add_argument(
        "--library",
        default=None,
        help="libonnxruntime_ep_mlu.so (default: get_library_path() of this process, in-process and on a local "
        "cluster; of each worker, on a joined cluster)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads per session (default 1: the frames are the parallelism; 0: ONNX Runtime's default)",
    )
    ap.add_argument("--ray", action="store_true", help="start a local Ray cluster and run there")
    ap.add_argument("--address", default=None, help="join a Ray cluster: auto, ray://host:10001, host:6379")
    ap.add_argument("--num-cpus", type=_positive, default=None, help="CPUs of the local cluster (--ray; default: all)")
    ap.add_argument("--workers", default="2", help="actors (1 CPU each); a list (1,2) runs the same frames once per size")
    ap.add_argument("--batch-size", type=_positive, default=4, help="frames per actor task (default 4)")
    ap.add_argument("--runtime-env", default=None, help="Ray runtime_env as JSON (e.g. pip/py_modules for a multi-node cluster)")
    ap.add_argument("--crash-once", default=None, metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--write-frames", default=None, metavar="DIR", help="write the generated frames in the folder layout, then stop")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every per-frame result to FILE")
    args = ap.parse_args(argv)

    if args.library:
        args.library = os.path.abspath(args.library)  # the path as given, not against ORT's folder
        if not os.path.isfile(args.library):
            ap.error(f"--library {args.library}: file not found (pass the path of libonnxruntime_ep_mlu.so, or leave "
                     "--library out for the package's own)")
    if args.zoo is not None and not Path(args.zoo).is_file():
        ap.error(f"--zoo {args.zoo}: file not found (pass the path of a zoo.json such as the checkout's "
                 "models/zoo.json, or leave --zoo out for the packaged zoo)")
    zoo_json = args.zoo or default_zoo()
    names = [m for m in args.models.split(",") if m] if args.models else None
    if args.models is not None and not names:
        ap.error("--models takes a comma-separated list of model names")
    paths = [p for p in args.paths.split(",") if p]
    if not paths or any(p not in PATHS for p in paths):
        ap.error(f"--paths takes cpu and/or mlu, got {args.paths!r}")
    try:
        workers = [_positive(w) for w in str(args.workers).split(",") if w]
    except argparse.ArgumentTypeError as e:
        ap.error(f"--workers takes positive counts separated by commas: {e}")
    if not workers:
        ap.error("--workers takes positive counts separated by commas")
    runtime_env = {}
    if args.runtime_env:
        try:
            runtime_env = json.loads(args.runtime_env)
        except ValueError as e:
            ap.error(f"--runtime-env takes a JSON object ({e})")
        if not isinstance(runtime_env, dict):
            ap.error("--runtime-env takes a JSON object, e.g. '{\"pip\": [\"onnxruntime==1.31.1\"]}'")
    if args.runtime_env and not (args.ray or args.address):
        ap.error("--runtime-env is for Ray runs: pass --ray or --address too")
    if not args.library and not args.address and not args.write_frames:
        # In this process and on a local cluster the library is this process's: find it now.
        try:
            get_library_path()
        except FileNotFoundError as e:
            ap.error(f"{e}; or pass --library")

    if args.frames and args.write_frames:
        ap.error("--write-frames writes generated frames: it does not take --frames")
    if args.frames:
        try:
            models = load_dataset_models(args.frames, zoo_json, names)
            rows = dataset_frames(args.frames, models, args.limit)
        except (OSError, ValueError) as e:
            ap.error(f"--frames {args.frames}: {e}")
        expected = {m: [r["frame"] for r in rows if r["model"] == m] for m in models}
        source = f"{len(rows)} frames from {args.frames}"
    else:
        if zoo_json is None:
            ap.error("this package has no zoo (it was not built from the repository with pip): pass --zoo with the "
                     "path of the checkout's models/zoo.json")
        try:
            known = list(_read_zoo(zoo_json))
            unknown = [n for n in names or () if n not in known]
            if unknown:
                ap.error(f"--models: no model {', '.join(unknown)} in {zoo_json} (it has {','.join(known)})")
            models = load_zoo(zoo_json, names)
            generated_frames(models, 1)  # every model has a generator, checked before any work
        except (OSError, ValueError) as e:
            ap.error(f"--zoo {zoo_json}: {e}" if args.zoo else f"the packaged zoo: {e}")
        count = 20 if args.generate is None else args.generate
        if args.write_frames:
            try:
                n = write_frames(args.write_frames, models, count, args.seed)
            except OSError as e:
                ap.error(f"--write-frames {args.write_frames}: {e}")
            print(f"wrote {n} frames, with each model's model.onnx and tolerances.json, to {args.write_frames}/<model>/ "
                  f"(read them back with --frames {args.write_frames})")
            return 0
        try:
            reference = load_reference(args.reference) if args.reference else None
        except (OSError, ValueError) as e:
            ap.error(f"--reference {args.reference}: {e}")
        rows = generated_frames(models, count, args.seed, reference)
        expected = {m: [r["frame"] for r in rows if r["model"] == m] for m in models}
        source = (f"{count} generated frames per model (seed {args.seed}; frame 0: the zoo frame and its goldens; "
                  f"frames 1..: {'goldens of ' + args.reference if reference else 'the CPU path as their reference'})")
    print(f"{len(models)} model(s): {', '.join(models)}; {source}; paths {', '.join(paths)}"
          f"{' (emulated card)' if 'mlu' in paths and args.emulate else ''}")

    runs, failed_runs = [], 0
    if args.ray or args.address:
        import logging

        try:
            import ray
        except ImportError:
            print("--ray and --address need Ray, an optional extra of the package: pip install 'onnxruntime-ep-mlu[ray]' "
                  "(from the checkout: pip install './python[ray]')", file=sys.stderr)
            return 2
        logging.getLogger("ray.data").setLevel(logging.WARNING)

        library = args.library
        if args.address is None:
            # A local cluster: its workers are processes of this machine, and get this
            # process's library. When the package is imported from the checkout rather than
            # installed, the workers get its folder on their path too.
            if _repo_root() is not None:
                # python/, above onnxruntime_ep_mlu/regression/_cli.py.
                pkg_parent = str(Path(__file__).resolve().parents[2])
                env_vars = dict(runtime_env.get("env_vars", {}))
                env_vars["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, os.environ.get("PYTHONPATH")) if p)
                runtime_env["env_vars"] = env_vars
            library = library or get_library_path()
            # address="local": a new cluster, even when this machine runs one (`ray start`).
            ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                     runtime_env=runtime_env or None, log_to_driver=False)
        else:
            ray.init(address=args.address, runtime_env=runtime_env or None, log_to_driver=False)
        try:
            for w in workers:
                try:
                    runs.append(
                        run_ray(rows, models, workers=w, paths=paths, emulate=args.emulate, library=library,
                                threads=args.threads, batch_size=args.batch_size, crash_once=args.crash_once)
                    )
                except Exception as e:  # noqa: BLE001 -- e.g. a frame that kills its worker every time
                    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    print(f"\nREGRESSION: the Ray run with {w} worker(s) failed: {type(e).__name__}: {msg}")
                    failed_runs += 1
        finally:
            ray.shutdown()
    else:
        runs.append(
            run_in_process(rows, models, paths=paths, emulate=args.emulate, library=args.library, threads=args.threads)
        )

    ok, infos = failed_runs == 0, []
    for results, info in runs:
        table, run_ok, info = summarize(results, info, expected)
        ok &= run_ok
        infos.append(info)
        print()
        print(table)
    if len(infos) > 1:
        print()
        for info in infos:
            print(
                f"workers {info['workers']}: {info['throughput']:.1f} frames/s from the first frame to the last "
                f"({info['throughput'] / infos[0]['throughput']:.2f}x of {infos[0]['workers']}); "
                f"{info['wall_throughput']:.1f} frames/s over the wall time, actor start-up included "
                f"({info['wall_throughput'] / infos[0]['wall_throughput']:.2f}x)"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps([{"info": info, "results": r} for (r, _), info in zip(runs, infos)], default=str, indent=1)
        )
    print()
    print("every frame matches its reference on every path" if ok else "REGRESSION: some frames failed (see above)")
    return 0 if ok else 1
