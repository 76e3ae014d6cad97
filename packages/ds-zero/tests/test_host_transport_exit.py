"""A process that exits while its host transport still runs a launched collective lets it finish first.

Python kills daemon threads at finalization; one killed inside torch's C++ code aborts the process
("terminate called without an active exception"), which a finished 4-rank ZeRO-3 job did in CI.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_exit_waits_for_the_collectives_already_launched(tmp_path):
    out = tmp_path / "done"
    script = textwrap.dedent(f"""
        import pathlib, time
        from ds_zero._host_transport import HostTransport

        def call():
            time.sleep(0.5)  # still running when the main thread reaches the end of the script
            pathlib.Path({str(out)!r}).write_text("done")

        HostTransport().submit([(None, call)])  # launched, never waited for
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "done", "the launched call was cut off at exit"
