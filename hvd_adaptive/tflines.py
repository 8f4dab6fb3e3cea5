"""TensorFlow's start-up lines: which lines they are, and a filter that drops them.

TensorFlow (2.21) logs INFO lines through absl's C++ logging when it is first imported, before
absl is initialized ("WARNING: All log messages before absl::InitializeLog() is called are
written to STDERR", then "I0000 ... port.cc:153] oneDNN custom operations are on ..."), on some
hosts whatever TF_CPP_MIN_LOG_LEVEL says (seen on an AMD EPYC host). hvd_adaptive.tfload drops
them from the ranks' own import; launch/train.sh drops horovodrun's (it imports TensorFlow to
check Horovod's build) by piping stderr through this module:

    horovodrun ... 2> >(python -m hvd_adaptive.tflines >&2)

Nothing here imports TensorFlow.
"""
import re
import sys

# absl's INFO prefix (severity I, MMDD, time, thread, file:line]; before absl's initialization
# the date reads 0000 and the time 00:00:<seconds since 1970>) and its pre-initialization notice.
_INFO = re.compile(rb"^I\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] ")
_NOTICE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def is_start_up(line: bytes) -> bool:
    """Whether `line` is an absl INFO line or absl's pre-initialization notice."""
    return bool(_INFO.match(line)) or line.rstrip(b"\r\n") == _NOTICE


def start_up_filter(text: bytes) -> bytes:
    """The lines of `text` that are not absl INFO lines nor absl's pre-initialization notice."""
    return b"".join(line for line in text.splitlines(keepends=True) if not is_start_up(line))


def main() -> int:
    """Copies stdin to stdout line by line as it comes, without the start-up lines."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not is_start_up(line):
            out.write(line)
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
