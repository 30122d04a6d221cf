"""Every element of the contracts is documented, and server reflection carries the comments.

The comments of ``protos/llmesh/v1/*.proto`` are the reference of the API (units, defaults,
limits, errors): generated code and ``grpcurl describe`` show them. The first tests compile
the contracts with their source info and list every service, RPC, message, field, oneof, enum
and enum value without a comment; the last one asks a real policy server over reflection.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc_tools
from google.protobuf import descriptor_pb2
from grpc_tools import protoc
from llmesh import codegen
from llmesh.v1 import policy_pb2

from policy.config import DEFAULT_RULESET
from services.runtime import reflection
from services.runtime.cli.smoke import grpcurl_path
from tests.integration.policy.conftest import serve_policy

# Field numbers of the descriptor messages, as SourceCodeInfo paths use them.
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 4, 5, 6
_MESSAGE_FIELD, _MESSAGE_NESTED, _MESSAGE_ENUM, _MESSAGE_ONEOF = 2, 3, 4, 8
_ENUM_VALUE = 2
_SERVICE_METHOD = 2


def compile_with_comments(root: Path, files: Sequence[str], out: Path) -> descriptor_pb2.FileDescriptorSet:
    """The descriptors of ``files`` (relative to ``root``) with their source info (comments)."""
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{well_known}",
        "--include_source_info",
        f"--descriptor_set_out={out}",
        *files,
    ]
    assert protoc.main(args) == 0, f"protoc failed on {files}"
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def contracts(tmp_path: Path) -> descriptor_pb2.FileDescriptorSet:
    files = [str(p.relative_to(codegen.PROTO_ROOT)) for p in codegen.proto_files()]
    return compile_with_comments(codegen.PROTO_ROOT, files, tmp_path / "contracts.binpb")


def comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    """Leading and trailing comment text of each element of ``file``, by source path."""
    return {
        tuple(loc.path): (loc.leading_comments + loc.trailing_comments).strip()
        for loc in file.source_code_info.location
    }


def elements(file: descriptor_pb2.FileDescriptorProto) -> Iterator[tuple[tuple[int, ...], str]]:
    """(source path, "kind name") of every element that must carry a comment."""
    for i, service in enumerate(file.service):
        yield (_FILE_SERVICE, i), f"service {service.name}"
        for j, method in enumerate(service.method):
            yield (_FILE_SERVICE, i, _SERVICE_METHOD, j), f"rpc {service.name}.{method.name}"
    for i, message in enumerate(file.message_type):
        yield from _message((_FILE_MESSAGE, i), message, "")
    for i, enum in enumerate(file.enum_type):
        yield from _enum((_FILE_ENUM, i), enum, "")


def _message(
    path: tuple[int, ...], message: descriptor_pb2.DescriptorProto, prefix: str
) -> Iterator[tuple[tuple[int, ...], str]]:
    if message.options.map_entry:
        return  # the synthetic entry type of a map field: the field itself is documented
    name = prefix + message.name
    yield path, f"message {name}"
    for k, field in enumerate(message.field):
        yield (*path, _MESSAGE_FIELD, k), f"field {name}.{field.name}"
    # A proto3 `optional` field lives in a synthetic oneof of its own, which has no source.
    synthetic = {f.oneof_index for f in message.field if f.proto3_optional}
    for k, oneof in enumerate(message.oneof_decl):
        if k not in synthetic:
            yield (*path, _MESSAGE_ONEOF, k), f"oneof {name}.{oneof.name}"
    for k, nested in enumerate(message.nested_type):
        yield from _message((*path, _MESSAGE_NESTED, k), nested, name + ".")
    for k, enum in enumerate(message.enum_type):
        yield from _enum((*path, _MESSAGE_ENUM, k), enum, name + ".")


def _enum(
    path: tuple[int, ...], enum: descriptor_pb2.EnumDescriptorProto, prefix: str
) -> Iterator[tuple[tuple[int, ...], str]]:
    name = prefix + enum.name
    yield path, f"enum {name}"
    for k, value in enumerate(enum.value):
        yield (*path, _ENUM_VALUE, k), f"enum value {name}.{value.name}"


def undocumented(fds: descriptor_pb2.FileDescriptorSet) -> list[str]:
    """Every element of the set without a non-empty comment, as "file: kind name"."""
    missing: list[str] = []
    for file in fds.file:
        text = comments(file)
        missing.extend(f"{file.name}: {what}" for path, what in elements(file) if not text.get(path))
    return missing


def test_every_element_of_the_contracts_has_a_comment(tmp_path: Path) -> None:
    fds = contracts(tmp_path)
    assert {f.name for f in fds.file} == {f"llmesh/v1/{p.name}" for p in codegen.proto_files()}, (
        "every contract compiled"
    )
    missing = undocumented(fds)
    assert not missing, f"{len(missing)} elements have no comment:\n" + "\n".join(missing)


def test_the_check_finds_what_lacks_a_comment(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "demo.proto").write_text(
        'syntax = "proto3";\npackage demo;\n'
        "// Documented.\nservice Demo {\n  rpc Call(Req) returns (Req);\n}\n"
        "// Documented.\nmessage Req {\n  // Documented.\n  string a = 1;\n  optional int32 b = 2;\n"
        "  map<string, string> c = 3;  // Trailing comments count.\n"
        "  oneof choice {\n    // Documented.\n    string d = 4;\n  }\n"
        "  enum Kind {\n    KIND_UNSPECIFIED = 0;  // Documented.\n    KIND_A = 1;\n  }\n}\n"
    )
    fds = compile_with_comments(tmp_path, ["demo/demo.proto"], tmp_path / "demo.binpb")
    assert undocumented(fds) == [
        "demo/demo.proto: rpc Demo.Call",
        "demo/demo.proto: field Req.b",
        "demo/demo.proto: oneof Req.choice",
        "demo/demo.proto: enum Req.Kind",
        "demo/demo.proto: enum value Req.Kind.KIND_A",
    ]


def _field_comments(fds: descriptor_pb2.FileDescriptorSet, full_name: str) -> dict[str, str]:
    """{field name: its comment} of the top-level message ``full_name`` ("llmesh.v1.X")."""
    package, _, name = full_name.rpartition(".")
    for file in fds.file:
        if file.package != package:
            continue
        text = comments(file)
        for i, message in enumerate(file.message_type):
            if message.name == name:
                return {
                    field.name: text[(_FILE_MESSAGE, i, _MESSAGE_FIELD, k)]
                    for k, field in enumerate(message.field)
                }
    raise KeyError(full_name)


def _words(text: str) -> str:
    """The text without comment markers and with single spaces (grpcurl re-wraps nothing, but
    prints each comment line behind ``//`` at the element's indentation)."""
    return " ".join(re.sub(r"^\s*//", "", line).strip() for line in text.splitlines()).strip()


async def _grpcurl(address: str, *verb: str, flags: tuple[str, ...] = ()) -> str:
    # Asynchronous: the server under test runs on this event loop.
    proc = await asyncio.create_subprocess_exec(
        grpcurl_path(),
        "-plaintext",
        "-max-time",
        "20",
        *flags,
        address,
        *verb,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 30)
    text = output.decode()
    assert proc.returncode == 0, f"grpcurl {' '.join(verb)} failed: {text}"
    return text


async def test_grpcurl_describe_shows_the_comments_of_a_real_server(tmp_path: Path, redis_url: str) -> None:
    fds = contracts(tmp_path)
    ruleset = tmp_path / "ruleset.yaml"
    shutil.copy(DEFAULT_RULESET, ruleset)
    served = await serve_policy(redis_url, ruleset)
    try:
        address = served.server.address
        requests = [
            m.input_type.full_name for m in policy_pb2.DESCRIPTOR.services_by_name["PolicyService"].methods
        ]
        assert "llmesh.v1.CheckInputRequest" in requests
        # The request messages of the service, and a shared message they use (common.proto).
        for message in [*requests, "llmesh.v1.ChatMessage"]:
            described = _words(await _grpcurl(address, "describe", message))
            for field, comment in _field_comments(fds, message).items():
                assert _words(comment) in described, (
                    f"grpcurl describe {message}: the comment of {field!r} is missing:\n{described}"
                )
        service = _words(await _grpcurl(address, "describe", "llmesh.v1.PolicyService"))
        assert "Checks the messages, tool definitions and retrieved documents of a request." in service
        # Reflection serves the compiled-in contract plus comments, nothing more: protoc's
        # json_name would switch grpcurl's JSON output from the field names to lowerCamelCase.
        answer = await _grpcurl(
            address, "llmesh.v1.PolicyService/GetRuleset", flags=("-d", "{}", "-H", "x-llmesh-tenant: t1")
        )
        assert '"hold_back_chars"' in answer, answer
    finally:
        await served.close()


def test_reflection_serves_comments_only_for_the_contract_the_process_runs() -> None:
    documented = reflection.documented_files()
    assert set(documented) == {f"llmesh/v1/{p.name}" for p in codegen.proto_files()}
    file = descriptor_pb2.FileDescriptorProto.FromString(documented["llmesh/v1/policy.proto"])
    assert file.source_code_info.location, "served with its comments"
    assert reflection._same_contract(file, policy_pb2.DESCRIPTOR.serialized_pb)
    # A .proto edited after the stubs were built describes another contract: no comments then.
    file.message_type[0].field[0].number += 100
    assert not reflection._same_contract(file, policy_pb2.DESCRIPTOR.serialized_pb)
