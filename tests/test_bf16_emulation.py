"""benchmarks/bf16_emulation.py: bfloat16 matmuls computed in float32, for memory checks on CPUs
without bfloat16 kernels. Run in a subprocess: the override is process-wide."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECK = r"""
import torch
import bf16_emulation  # noqa: F401
from attnmt.precision import effective_precision

torch.manual_seed(0)
x = torch.randn(64, 32, requires_grad=True)
w = torch.randn(48, 32, requires_grad=True)
b = torch.randn(48)
q, k = torch.randn(4, 8, 16), torch.randn(4, 16, 8)
with torch.autocast("cpu", dtype=torch.bfloat16):
    y = torch.nn.functional.linear(x, w, b)          # addmm
    z = torch.nn.functional.linear(x.view(8, 8, 32), w)  # mm on the folded batch
    s = q @ k                                        # bmm
    t = torch.baddbmm(torch.zeros(4, 8, 8), q, k)     # baddbmm
(y.float().sum() + z.float().sum()).backward()      # mm in the backward pass
ref = x.detach() @ w.detach().T + b
assert y.dtype == z.dtype == s.dtype == t.dtype == torch.bfloat16, (y.dtype, z.dtype, s.dtype, t.dtype)
assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2
assert ((s.float() - q @ k).abs().max() / (q @ k).abs().max()).item() < 2e-2
assert torch.allclose(t.float(), s.float())
gw = 2 * torch.ones(48, 64) @ x.detach()  # d(sum y + sum z)/dw: x enters both, once each
assert ((w.grad - gw).abs().max() / gw.abs().max()).item() < 2e-2, "weight gradient"
assert x.grad.dtype == torch.float32 and x.grad.shape == x.shape
f = torch.randn(5, 7) @ torch.randn(7, 3)           # float32 matmuls untouched
assert f.dtype == torch.float32
assert effective_precision("bf16") == "bf16"
print("ok")
"""


def test_bf16_emulation_matches_float32_within_bfloat16_rounding():
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'benchmarks'}", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "ok"
