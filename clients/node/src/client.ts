// A TypeScript client for llmesh's gRPC ChatService: Connect-ES over gRPC (HTTP/2).
//
// The API key goes in the `authorization: Bearer <key>` metadata of every call (gateway/auth.py).
// The consistency protocol (ARCHITECTURE.md, "The consistency protocol") travels in metadata:
// requests may carry x-llmesh-cache-version / x-llmesh-max-age / x-llmesh-no-store /
// x-llmesh-semantic, and every call returns the versions it observed, its cache status and the
// cached answer's age in its trailers (services/runtime/context.py).

import { readFileSync } from "node:fs";

import { Code, ConnectError, createClient as createConnectClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { ChatService } from "./gen/llmesh/v1/chat_pb.js";

export { ChatService };
export { Code, ConnectError };

export const AUTHORIZATION = "authorization";
export const CACHE_VERSION = "x-llmesh-cache-version";
export const MAX_AGE = "x-llmesh-max-age";
export const NO_STORE = "x-llmesh-no-store";
export const SEMANTIC = "x-llmesh-semantic";
export const CACHE_STATUS = "x-llmesh-cache-status";
export const AGE = "x-llmesh-age";
export const RESPONSE_SHA256 = "x-llmesh-response-sha256";

/** How a request was served by the response cache (services/runtime/cache_status.py). */
export const CACHE_STATUSES = ["HIT", "MISS", "STALE", "BYPASS"] as const;
export type CacheStatusName = (typeof CACHE_STATUSES)[number];

export interface TlsOptions {
  /** PEM file of the CA that signed the server's certificate (default: the system's CAs). */
  caFile?: string;
  /** PEM files of a client certificate and its key, for mutual TLS. */
  certFile?: string;
  keyFile?: string;
  /** The name the server's certificate must carry, when it differs from the address's host. */
  serverName?: string;
}

export interface ClientOptions {
  /** TLS to the gateway; without it the connection is plaintext HTTP/2 (h2c). */
  tls?: TlsOptions;
}

export interface LlmeshClient {
  /** The generated ChatService methods: complete, completeStream, createEmbeddings. */
  readonly chat: Client<typeof ChatService>;
  /** Closes the HTTP/2 connection (and any call still open on it). */
  close(): void;
}

/**
 * A ChatService client for `address` (`host:port`) that sends `apiKey` with every call.
 *
 * Per call, pass Connect's CallOptions: `timeoutMs` (the gRPC deadline), `headers` (e.g. from
 * {@link consistencyHeaders}), `onTrailer` (read it with {@link readConsistency}).
 */
export function createClient(address: string, apiKey: string, options: ClientOptions = {}): LlmeshClient {
  const baseUrl = `${options.tls ? "https" : "http"}://${address}`;
  const sessionManager = new Http2SessionManager(baseUrl, {}, options.tls ? tlsOptions(options.tls) : {});
  const transport = createGrpcTransport({
    baseUrl,
    sessionManager,
    interceptors: [bearer(apiKey)],
  });
  return {
    chat: createConnectClient(ChatService, transport),
    close: () => sessionManager.abort(),
  };
}

function bearer(apiKey: string): Interceptor {
  return (next) => async (request) => {
    request.header.set(AUTHORIZATION, `Bearer ${apiKey}`);
    return next(request);
  };
}

function tlsOptions(tls: TlsOptions): { ca?: Buffer; cert?: Buffer; key?: Buffer; servername?: string } {
  if ((tls.certFile === undefined) !== (tls.keyFile === undefined)) {
    throw new Error("mutual TLS needs both certFile and keyFile");
  }
  return {
    ...(tls.caFile !== undefined && { ca: readFileSync(tls.caFile) }),
    ...(tls.certFile !== undefined && { cert: readFileSync(tls.certFile) }),
    ...(tls.keyFile !== undefined && { key: readFileSync(tls.keyFile) }),
    ...(tls.serverName !== undefined && { servername: tls.serverName }),
  };
}

export interface ConsistencyRequest {
  /** Version floors per namespace ("" is a floor for every namespace), e.g. a previous call's. */
  versions?: Record<string, bigint>;
  /** Oldest acceptable cached answer in ms; 0: do not serve from the cache. */
  maxAgeMs?: number;
  /** Store nothing this request produces. */
  noStore?: boolean;
  /** Accept a semantic (similar prompt) cache hit. */
  semantic?: boolean;
}

/** The request metadata of the consistency protocol, for a call's `headers` option. */
export function consistencyHeaders(request: ConsistencyRequest): Headers {
  const headers = new Headers();
  if (request.versions !== undefined && Object.keys(request.versions).length > 0) {
    headers.set(CACHE_VERSION, formatVersions(request.versions));
  }
  if (request.maxAgeMs !== undefined) {
    headers.set(MAX_AGE, String(request.maxAgeMs));
  }
  if (request.noStore) {
    headers.set(NO_STORE, "1");
  }
  if (request.semantic) {
    headers.set(SEMANTIC, "on");
  }
  return headers;
}

export interface Consistency {
  /** Highest version per namespace the call observed or produced ("" for a bare floor). */
  versions: Record<string, bigint>;
  /** The raw x-llmesh-cache-version value ("" when absent). */
  versionHeader: string;
  cacheStatus: CacheStatusName | undefined;
  /** Age of a cached answer, in ms. */
  ageMs: number | undefined;
  /** SHA-256 (hex) of the released answer. */
  responseSha256: string | undefined;
}

/** The consistency metadata of a call's trailers (or of a ConnectError's `metadata`). */
export function readConsistency(trailers: Headers): Consistency {
  const versionHeader = trailers.get(CACHE_VERSION) ?? "";
  const status = trailers.get(CACHE_STATUS) ?? undefined;
  if (status !== undefined && !isCacheStatus(status)) {
    throw new Error(`unknown ${CACHE_STATUS} value ${JSON.stringify(status)}`);
  }
  const age = trailers.get(AGE);
  return {
    versions: parseVersions(versionHeader),
    versionHeader,
    cacheStatus: status,
    ageMs: age === null ? undefined : Number.parseInt(age, 10),
    responseSha256: trailers.get(RESPONSE_SHA256) ?? undefined,
  };
}

function isCacheStatus(value: string): value is CacheStatusName {
  return (CACHE_STATUSES as readonly string[]).includes(value);
}

// Versions are up to 2^63 - 1 (services/runtime/context.py): bigint keeps them exact, so a floor
// sent back is never rounded below the version it came from.
const MAX_VERSION = 2n ** 63n - 1n;

/** Parses `N` / `ns=N,ns2=M` (namespaces percent-encoded) into versions per namespace. */
export function parseVersions(value: string): Record<string, bigint> {
  const versions: Record<string, bigint> = {};
  for (const item of value.split(",")) {
    const entry = item.trim();
    if (entry === "") {
      continue;
    }
    const sep = entry.lastIndexOf("=");
    const namespace = sep < 0 ? "" : decodeURIComponent(entry.slice(0, sep));
    const number = entry.slice(sep + 1).trim();
    if (!/^\d+$/.test(number) || (sep >= 0 && namespace === "") || BigInt(number) > MAX_VERSION) {
      throw new Error(`malformed ${CACHE_VERSION} entry ${JSON.stringify(entry)}`);
    }
    const version = BigInt(number);
    const seen = versions[namespace];
    versions[namespace] = seen === undefined || version > seen ? version : seen;
  }
  return versions;
}

// A metadata value is printable ASCII; "," and "=" separate entries and "%" escapes.
const UNSAFE = /[^\x21-\x7e]|[,=%]/gu;

/** Formats versions per namespace as the x-llmesh-cache-version value. */
export function formatVersions(versions: Record<string, bigint>): string {
  return Object.entries(versions)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([namespace, version]) =>
      namespace === "" ? String(version) : `${namespace.replace(UNSAFE, encodeURIComponent)}=${version}`,
    )
    .join(",");
}

// gRPC's names of the status codes (Connect's Code enum spells them in camel case).
const GRPC_CODE_NAMES: Record<Code, string> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

/** The gRPC name of a status code (e.g. "DEADLINE_EXCEEDED"). */
export function grpcCodeName(code: Code): string {
  return GRPC_CODE_NAMES[code];
}
