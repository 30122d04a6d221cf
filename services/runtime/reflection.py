"""Server reflection that carries the comments of the contracts in ``protos/``.

grpcio-reflection describes a service from the descriptors compiled into the generated
``_pb2`` modules, and protoc's Python generator leaves the source comments out of them, so
``grpcurl describe`` would show the contracts without a word of their documentation. This
servicer answers with the same files compiled with their comments (protoc
``--include_source_info`` over the ``.proto`` files that ship with the ``llmesh`` package),
once per process.

A documented file is served only where it describes exactly the contract the process runs
(the compiled-in descriptor, comments aside); otherwise, or when the ``.proto`` files cannot be
compiled, reflection answers with the compiled-in descriptors as before (logged).
"""

from __future__ import annotations

import functools
import importlib
import logging
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import _async, reflection, reflection_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = reflection.SERVICE_NAME


def _without_json_names(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    # protoc's descriptor set names each field's JSON name; the Python generator leaves it out.
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _without_json_names(message.nested_type)


def _same_contract(documented: descriptor_pb2.FileDescriptorProto, compiled: bytes) -> bool:
    bare = descriptor_pb2.FileDescriptorProto()
    bare.CopyFrom(documented)
    bare.ClearField("source_code_info")
    _without_json_names(bare.message_type)
    running = descriptor_pb2.FileDescriptorProto.FromString(compiled)
    _without_json_names(running.message_type)
    return bare == running


@functools.cache
def documented_files() -> Mapping[str, bytes]:
    """``{file name: serialized FileDescriptorProto with comments}`` of every contract whose
    comments could be compiled and which matches the stubs this process imported."""
    try:
        import grpc_tools
        from grpc_tools import protoc
        from llmesh import codegen
    except ImportError as exc:
        log.warning("reflection serves the contracts without comments: %s", exc)
        return {}
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(codegen.PROTO_ROOT)) for p in codegen.proto_files()]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "contracts.binpb"
        args = [
            "grpc_tools.protoc",
            f"-I{codegen.PROTO_ROOT}",
            f"-I{well_known}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *files,
        ]
        if not files or protoc.main(args) != 0:
            log.warning("reflection serves the contracts without comments: protoc failed on %s", files)
            return {}
        compiled_set = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    documented: dict[str, bytes] = {}
    for file in compiled_set.file:
        module = importlib.import_module(file.name.removesuffix(".proto").replace("/", ".") + "_pb2")
        if _same_contract(file, module.DESCRIPTOR.serialized_pb):
            # Exactly the compiled-in descriptor plus comments: with protoc's json_name, grpcurl
            # would switch its JSON output from the field names to lowerCamelCase.
            _without_json_names(file.message_type)
            documented[file.name] = file.SerializeToString()
        else:
            log.warning(
                "%s differs from its generated stubs (run `llmesh protos build`): "
                "reflection serves it without comments",
                file.name,
            )
    return documented


class DocumentedReflectionServicer(_async.ReflectionServicer):  # type: ignore[misc]  # untyped package
    """grpcio-reflection's servicer, answering with the documented file where there is one."""

    def __init__(self, service_names: Iterable[str], documented: Mapping[str, bytes]) -> None:
        super().__init__(service_names)
        self._documented = documented

    def _with_comments(self, response: Any) -> Any:
        if self._documented and response.HasField("file_descriptor_response"):
            files = response.file_descriptor_response.file_descriptor_proto
            for i, blob in enumerate(files):
                name = descriptor_pb2.FileDescriptorProto.FromString(blob).name
                if name in self._documented:
                    files[i] = self._documented[name]
        return response

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        return self._with_comments(super()._file_by_filename(request, filename))

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        return self._with_comments(super()._file_containing_symbol(request, fully_qualified_name))

    def _file_containing_extension(self, request: Any, containing_type: str, extension_number: int) -> Any:
        return self._with_comments(
            super()._file_containing_extension(request, containing_type, extension_number)
        )


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Adds server reflection for ``service_names`` (and itself) to ``server``, with comments."""
    servicer = DocumentedReflectionServicer(service_names, documented_files())
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
