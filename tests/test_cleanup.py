"""A test run stops every process it started, whatever path it ends by."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.services import free_port

ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_process_left_running_is_stopped_when_the_run_exits(db_url: str,
                                                              tmp_path: Path) -> None:
    """A run that ends without stopping its API (an assertion that fired before the
    fixture's clean-up, say) still takes it down on exit."""
    script = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from tests.support.services import DarkroomProcess
        env = {{**os.environ, "DARKROOM_DATABASE_URL": {db_url!r},
               "DARKROOM_DATA_DIR": {str(tmp_path / "data")!r}}}
        proc = DarkroomProcess(["api", "--port", "{free_port()}"], env,
                               Path({str(tmp_path / "api.log")!r}))
        print(proc.pid, flush=True)
        sys.exit(3)  # no stop(): the exit itself must do it
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    pid = int(done.stdout.strip())
    assert not alive(pid)
