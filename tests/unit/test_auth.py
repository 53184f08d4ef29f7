"""wire.auth without sockets: the guard around handlers, the token stamp on clients."""

from __future__ import annotations

from typing import Any

import pytest

from thrift_trainer.wire.auth import TokenClient, TokenGuard, check_token, guard_processor, unwrap
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, Coordinator, ttypes

TOKEN = "s3cret-token"
SERVICES = {"ComputeNode": ComputeNode, "Coordinator": Coordinator}


def methods_of(service: Any) -> list[str]:
    return sorted(service.Processor(None)._processMap)


def request_type(service: Any, method: str) -> type:
    """The request struct of `method`: the type of its single argument in the IDL."""
    return getattr(service, f"{method}_args").thrift_spec[1][3][0]


EVERY_METHOD = [(name, method) for name, service in SERVICES.items()
                for method in methods_of(service)]


class Recorder:
    """A handler answering every method with its name; counts the calls that got through."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.label = "not a method"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def method(request: Any) -> str:
            self.calls.append(name)
            return name

        return method


@pytest.mark.parametrize("service_name, method", EVERY_METHOD)
@pytest.mark.parametrize("token, refusal", [(None, "carried none"), ("wrong", "does not match")])
def test_every_method_refuses_a_missing_or_wrong_token(service_name, method, token, refusal):
    handler = Recorder()
    guard = TokenGuard(handler, TOKEN)
    request = request_type(SERVICES[service_name], method)(token=token)
    with pytest.raises(ttypes.Unauthorized, match=refusal) as info:
        getattr(guard, method)(request)
    assert "--token-file" in info.value.message and "TRAINER_TOKEN" in info.value.message
    assert TOKEN not in info.value.message
    assert handler.calls == []


@pytest.mark.parametrize("service_name, method", EVERY_METHOD)
def test_every_method_passes_the_right_token_to_the_handler(service_name, method):
    handler = Recorder()
    request = request_type(SERVICES[service_name], method)(token=TOKEN)
    assert getattr(TokenGuard(handler, TOKEN), method)(request) == method
    assert handler.calls == [method]


def test_a_request_without_a_token_field_is_refused():
    with pytest.raises(ttypes.Unauthorized):
        TokenGuard(Recorder(), TOKEN).ping(object())


def test_guard_passes_private_and_plain_attributes_through():
    handler = Recorder()
    guard = TokenGuard(handler, TOKEN)
    assert guard.label == "not a method"
    with pytest.raises(AttributeError):
        _ = guard._hidden


def test_check_token_accepts_non_ascii_tokens():
    check_token("clé-ünï", "clé-ünï")
    with pytest.raises(ttypes.Unauthorized):
        check_token("clé-üni", "clé-ünï")


def test_an_empty_token_cannot_make_a_guard():
    with pytest.raises(ValueError):
        TokenGuard(Recorder(), "")


def test_guard_processor_copies_the_processor():
    handler = Recorder()
    processor = ComputeNode.Processor(handler)
    guarded = guard_processor(processor, TOKEN)
    assert processor._handler is handler  # the caller's processor is left unguarded
    assert isinstance(guarded._handler, TokenGuard)
    with pytest.raises(TypeError, match="not a Thrift-generated Processor"):
        guard_processor(object(), TOKEN)


class FakeClient:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self._iprot = "protocol"

    def ping(self, request: Any) -> Any:
        self.sent.append(request)
        return request

    def recv_ping(self) -> str:
        return "answer"


def test_token_client_stamps_a_copy_of_each_request():
    inner = FakeClient()
    client = TokenClient(inner, TOKEN)
    original = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)
    sent = client.ping(original)
    assert sent.token == TOKEN and sent.protocol_version == PROTOCOL_VERSION
    assert original.token is None  # the caller's request is never changed
    assert client.recv_ping() == "answer"  # calls without a request pass through
    assert client._iprot == "protocol" and unwrap(client) is inner and unwrap(inner) is inner


def test_token_client_keeps_a_token_the_caller_chose():
    client = TokenClient(FakeClient(), TOKEN)
    request = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION, token="chosen")
    assert client.ping(request).token == "chosen"
