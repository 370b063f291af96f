"""asyncio around the loop (`arun`, `astream`): a run goes on in a thread of its own, so a blocking
tool or request never blocks the event loop; an async def tool is awaited on the caller's loop;
cancelling the task asks the run to stop, and the run ends as interrupted with its end record;
the runs share one limit on requests in flight to an endpoint, as a batch's tasks do.

It imports endings, settings, tools, request_gate and the client's is_local.
"""
import asyncio
import threading
from typing import Any, AsyncIterator, Callable, Dict, Optional, Tuple

from agent_demo_kit.client import is_local
from agent_demo_kit.request_gate import RequestGate
from agent_demo_kit.settings import HOSTED_PARALLEL, Settings
from agent_demo_kit.tools import await_on

_gates: Dict[Tuple[str, int], RequestGate] = {}
_gates_made = threading.Lock()


def shared_gate(parallel: Optional[int]) -> Callable[[Settings], RequestGate]:
    """For a run's settings, the limit on requests in flight that every arun() and astream() to its
    endpoint shares: `parallel` at most (default as --batch: 1 for a local server, else HOSTED_PARALLEL),
    lowered by 429s."""
    def gate_for(settings: Settings) -> RequestGate:
        most = parallel or (1 if is_local(settings.endpoint) else HOSTED_PARALLEL)
        with _gates_made:
            return _gates.setdefault((settings.endpoint, most), RequestGate(most))
    return gate_for


async def in_a_thread(work: Callable[[threading.Event], Any]) -> Any:
    """What work(stop) returns, run in a thread of its own while the event loop goes on. Cancelled,
    it sets `stop`, waits for the run to end (it does before its next request, or at the next piece
    of a streamed reply) and is cancelled."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    stop = threading.Event()

    def settle(value: Any, error: Optional[BaseException]) -> None:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(value)

    def target() -> None:
        await_on(loop, stop)  # its async tools are awaited on this loop
        try:
            value, error = work(stop), None
        except BaseException as raised:  # the caller's own function raised, or a ConfigError
            value, error = None, raised
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop was closed meanwhile: nobody waits for it
            pass
    threading.Thread(target=target, name="agent-demo run", daemon=True).start()
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        while not done.done():  # the run records its end before the cancellation goes on
            try:
                await asyncio.shield(done)
            except asyncio.CancelledError:
                continue
            except BaseException:
                break
        raise


_OVER = object()  # the run's thread has returned


async def events_of(work: Callable[[threading.Event, Callable[[Any], None]], Any]) -> AsyncIterator[Any]:
    """Each event work(stop, emit) emits, in order, as it comes; then what the run raised, if it did.
    Leaving the loop early (break, or the task cancelled) stops the run."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def whole(stop: threading.Event) -> Any:
        def emit(event: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the loop was closed: nobody listens, the run stops
                stop.set()
        try:
            return work(stop, emit)
        finally:
            emit(_OVER)
    running = asyncio.ensure_future(in_a_thread(whole))
    try:
        while True:
            event = await queue.get()
            if event is _OVER:
                break
            yield event
        await running  # what the run raised reaches the caller
    finally:
        if not running.done():
            running.cancel()
            try:
                await running
            except BaseException:
                pass
