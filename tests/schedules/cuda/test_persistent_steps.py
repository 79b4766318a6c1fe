"""host_source.persistent_steps: a persistent kernel's (tile, k) step loop over a run-time K,
split into a tile loop around a k loop, runs the same steps in the same order (checked by
compiling both forms of a loop in TileLang's generated form with the host C compiler)."""
import shutil
import subprocess

import pytest

from lcmac.core.errors import ToolchainError
from lcmac.schedules.cuda.host_source import persistent_steps

# the producer and consumer loops as TileLang 0.1.15 emits them for the persistent batched
# GEMM of run-time Mb, Nb, Kb (abridged: the loads and wgmmas print what they would read)
KERNEL = """\
extern "C" void __launch_bounds__(384, 1) kernel(int Kb, int Mb, int Nb, int pid, int role) {
  if (role == 0) {
    for (int it = 0; it < ((((((((Nb + 255) / 256) * ((Mb + 127) / 128)) * 7) + 131) - pid) / 132) * ((Kb + 63) >> 6)); ++it) {
      wait(((it % 3) + 3), (((it % 6) / 3) ^ 1));
      load((it % 3), ((it % ((Kb + 63) >> 6)) * 64), (((it / ((Kb + 63) >> 6)) * 132) + pid));
    }
  } else {
    for (int it_1 = 0; it_1 < ((((((((Nb + 255) / 256) * ((Mb + 127) / 128)) * 7) + 131) - pid) / 132) * ((Kb + 63) >> 6)); ++it_1) {
      wait((it_1 % 3), ((it_1 % 6) / 3));
      mma(((it_1 % ((Kb + 63) >> 6)) == 0) ? 0 : 1);
      if ((it_1 % ((Kb + 63) >> 6)) == (((Kb + 63) >> 6) - 1)) {
        store((((it_1 / ((Kb + 63) >> 6)) * 132) + pid));
      }
    }
  }
}
"""

MAIN = r"""
#include <stdio.h>
#define __launch_bounds__(a, b)
static void wait(int bar, int parity) { printf("w %d %d\n", bar, parity); }
static void load(int stage, int k, int tile) { printf("l %d %d %d\n", stage, k, tile); }
static void mma(int acc) { printf("m %d\n", acc); }
static void store(int tile) { printf("s %d\n", tile); }
%s
int main(void) {
  int shapes[][3] = {{8192, 10240, 8192}, {64, 128, 256}, {4504, 6016, 5000}, {8, 128, 256}};
  for (int s = 0; s < 4; ++s)
    for (int pid = 0; pid < 132; pid += 43)
      for (int role = 0; role < 2; ++role) kernel(shapes[s][0], shapes[s][1], shapes[s][2], pid, role);
  return 0;
}
"""


def _run(tmp_path, code: str, name: str) -> str:
    src = tmp_path / f"{name}.c"
    src.write_text(MAIN.replace("%s", code.replace('extern "C" ', "")))
    exe = tmp_path / name
    subprocess.run([shutil.which("cc") or "gcc", "-O1", "-w", str(src), "-o", str(exe)], check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
def test_split_loops_run_the_same_steps_in_the_same_order(tmp_path):
    split = persistent_steps(KERNEL, "kernel")
    assert "/ ((Kb + 63) >> 6)" not in split and "% ((Kb + 63) >> 6)" not in split
    assert split.count("for (int lcmac_tile_") == 2 and split.count("for (int lcmac_k_") == 2
    before, after = _run(tmp_path, KERNEL, "flat"), _run(tmp_path, split, "split")
    assert before.count("\n") > 1000 and after == before


def test_a_kernel_without_such_a_loop_is_refused():
    static = KERNEL.replace("((Kb + 63) >> 6)", "128")
    with pytest.raises(ToolchainError, match="no persistent step loop"):
        persistent_steps(static, "kernel")


def test_a_step_that_uses_its_index_otherwise_is_refused():
    odd = KERNEL.replace("mma(((it_1 % ((Kb + 63) >> 6)) == 0) ? 0 : 1);", "mma(it_1 + 1);")
    with pytest.raises(ToolchainError, match="otherwise than as tile, slab or stage"):
        persistent_steps(odd, "kernel")
