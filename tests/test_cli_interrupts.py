"""Ctrl-C handling of the interactive commands (cli/_interrupts.py), in-process.

The end-to-end behaviour in a terminal is in test_cli_chat.py; these tests pin
down the two ways a Ctrl-C at the prompt could be lost, deterministically.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from specdec_cpu.cli._interrupts import PromptInterrupts, interruptible

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

# A read that nobody answers: if the Ctrl-C is lost, a safety thread answers it
# after this long so the test fails instead of hanging.
SAFETY_SECONDS = 30.0


def _syscall_of(tid: int) -> "list[str] | None":
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            return f.read().split()
    except OSError:
        return None


def test_a_sigint_that_missed_the_blocked_read_still_ends_it():
    """The race behind a lost Ctrl-C at the prompt: the SIGINT's C-level
    handler runs, but the main thread's blocking read is not interrupted by it
    (the signal arrived just before the read started, or another thread took
    it).  Python then only runs the handler when the read returns.  Here the
    main thread is verifiably blocked in read() before another thread takes
    the SIGINT; the prompt guard must still end the read with KeyboardInterrupt."""
    main_tid = threading.get_native_id()
    if _syscall_of(main_tid) is None:
        pytest.skip("needs /proc/self/task/<tid>/syscall to see that the main thread is blocked")
    r, w = os.pipe()
    fired = threading.Event()

    def deliver():
        # Wait until the main thread sits in read(r) (the syscall's first
        # argument is the fd), then take the SIGINT in this thread.
        deadline = time.monotonic() + SAFETY_SECONDS
        while time.monotonic() < deadline:
            fields = _syscall_of(main_tid)
            if fields and len(fields) > 1 and fields[1] == hex(r):
                break
            time.sleep(0.005)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        if not answered.wait(SAFETY_SECONDS):
            fired.set()
            os.write(w, b"x")

    answered = threading.Event()
    sender = threading.Thread(target=deliver, daemon=True)
    try:
        with PromptInterrupts() as interrupts:
            with pytest.raises(KeyboardInterrupt):
                with interrupts.reading():
                    sender.start()
                    os.read(r, 1)
        assert not fired.is_set(), "the read ended only when the safety thread answered it"
    finally:
        answered.set()
        sender.join()
        os.close(r)
        os.close(w)


def _ctrl_c_between_prompts() -> None:
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C between prompts raised KeyboardInterrupt")


def test_ctrl_c_raises_only_while_reading():
    with PromptInterrupts() as interrupts:
        _ctrl_c_between_prompts()
        with pytest.raises(KeyboardInterrupt):
            with interrupts.reading():
                signal.raise_signal(signal.SIGINT)
        _ctrl_c_between_prompts()


def test_the_session_handler_replaces_an_inherited_ignore():
    """A process started with SIGINT ignored (a background job of a script)
    must still get KeyboardInterrupt at the prompt."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with PromptInterrupts() as interrupts:
            with pytest.raises(KeyboardInterrupt):
                with interrupts.reading():
                    signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_reply_handler_nested_in_the_session_is_restored():
    with PromptInterrupts() as interrupts:
        session_handler = signal.getsignal(signal.SIGINT)
        with interruptible() as cancel:
            signal.raise_signal(signal.SIGINT)
            assert cancel.is_set()
        assert signal.getsignal(signal.SIGINT) == session_handler
        with pytest.raises(KeyboardInterrupt):
            with interrupts.reading():
                signal.raise_signal(signal.SIGINT)


def test_everything_is_restored_after_the_session():
    before_int = signal.getsignal(signal.SIGINT)
    before_urg = signal.getsignal(signal.SIGURG)
    threads = threading.active_count()
    with PromptInterrupts() as interrupts:
        with interrupts.reading():
            pass
        with pytest.raises(KeyboardInterrupt):
            with interrupts.reading():
                signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) == before_int
    assert signal.getsignal(signal.SIGURG) == before_urg
    assert signal.set_wakeup_fd(-1) == -1  # no wake-up fd left behind
    assert threading.active_count() == threads  # the watcher threads ended


def test_a_wakeup_fd_set_by_someone_else_is_left_alone():
    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w)
    try:
        with PromptInterrupts() as interrupts:
            with pytest.raises(KeyboardInterrupt):
                with interrupts.reading():
                    assert signal.set_wakeup_fd(w) == w  # still theirs
                    signal.raise_signal(signal.SIGINT)
        assert signal.set_wakeup_fd(w) == w
    finally:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)


def test_outside_the_main_thread_it_does_nothing():
    result = {}

    def run():
        with PromptInterrupts() as interrupts:
            with interrupts.reading():
                result["handler"] = signal.getsignal(signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert result["handler"] == before
