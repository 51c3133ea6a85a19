"""Reading from a child process in tests without the chance of a hang."""
import selectors


def first_line(proc, seconds: float = 60.0):
    """The first line a process prints on its stdout, stripped, or an empty one if none comes within `seconds`: a
    child that never says it is ready must fail the test, not hang it (readline alone waits for ever)."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(timeout=seconds):
            return proc.stdout.readline().strip()
    return "" if getattr(proc.stdout, "encoding", None) else b""
