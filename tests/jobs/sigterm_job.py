"""Waits for SIGTERM, records that it got it, and exits with code 42 (signal-forwarding test)."""

import signal
import sys
import time


def main() -> int:
    ready, got = sys.argv[1], sys.argv[2]

    def on_term(signum, frame):
        with open(got, "w") as fh:
            fh.write(str(signum))
        sys.exit(42)

    signal.signal(signal.SIGTERM, on_term)
    with open(ready, "w") as fh:
        fh.write("ready")
    time.sleep(60)
    return 1


if __name__ == "__main__":
    sys.exit(main())
