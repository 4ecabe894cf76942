"""`make demo`: capture the example classifier, then serve it from a fresh process.

Shows the whole compile-once-serve-many loop: capture (paying for tracing once), the
artifact pair on disk, and a new process that loads it and answers with no tracing and
no compiling, checked against eager.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "quickstart"))

from classifier import Classifier, classify

import precompile

SERVE = """
import sys, time, warnings
t0 = time.perf_counter()
import torch
import precompile
sys.path.insert(0, {quickstart!r})
from classifier import Classifier
t_import = time.perf_counter()
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
run = precompile.load({artifact!r}, {cache!r})
t_load = time.perf_counter()
torch.manual_seed(1)
model, images = Classifier().eval(), torch.randn(4, 3, 32, 32)
probs = run(model, images)
t_call = time.perf_counter()
torch.testing.assert_close(probs, model(images).softmax(-1))
print(f"  import torch + precompile {{t_import - t0:.2f}} s, load {{(t_load - t_import) * 1e3:.1f}} ms, "
      f"first call {{(t_call - t_load) * 1e3:.1f}} ms; matches eager with other weights")
for batch in (8, 13):
    images = torch.randn(batch, 3, 32, 32)
    torch.testing.assert_close(run(model, images), model(images).softmax(-1))
print("  batches of 8 and 13 are served too (the batch dim varied at capture, so it is dynamic)")
try:
    run(model, torch.randn(4, 3, 16, 16))
except precompile.PrecompileError as error:
    print("  16x16 images are refused:", str(error).splitlines()[0][:150], "...")
"""


def main() -> None:
    quickstart = str(Path(__file__).resolve().parent / "quickstart")
    with tempfile.TemporaryDirectory(prefix="precompile-demo-") as tmp:
        artifact, cache = f"{tmp}/classify.py", f"{tmp}/classify.cache"
        model = Classifier().eval()
        print(f"1. capture classify(model, images) under Dynamo, backend eager -> {artifact}")
        started = time.perf_counter()
        with precompile.capture(
            classify, artifact_path=artifact, cache_path=cache, backend="eager"
        ) as cap:
            for batch in (4, 6):
                cap(model, torch.randn(batch, 3, 32, 32))
        print(
            f"   two batch sizes captured in {time.perf_counter() - started:.2f} s: {cap.summary()}"
        )
        meta = precompile.inspect_artifact(artifact)
        print(
            f"2. the artifact: {Path(artifact).stat().st_size} bytes of Python; frames "
            f"{[(f['name'], f['variants']) for f in meta['FRAMES']]}"
        )
        print("3. serve it from a fresh process:")
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                SERVE.format(quickstart=quickstart, artifact=artifact, cache=cache),
            ],
            capture_output=True,
            text=True,
        )
        print(proc.stdout.rstrip())
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            raise SystemExit(1)
        print(f"   whole serving process: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
