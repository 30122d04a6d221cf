// End-to-end run of the client against a live gateway's ChatService (tests/e2e/test_node_client.py):
//
//   tsx src/e2e.ts --address HOST:PORT --api-key KEY [--deadline-ms 100] [--timeout-ms 120000]
//
// It makes four calls and prints one JSON object on stdout:
// * "stream", "repeat": the same greedy streamed completion twice (a unique prompt; the repeat
//   sends the versions the first observed as its floors, plus "node client,e2e"=7): text, the x-llmesh-cache-status
//   trailer (MISS, then HIT from the response cache) and the x-llmesh-cache-version trailer
//   (versions as decimal strings).
// * "unauthenticated": a unary call with a wrong API key.
// * "deadline": a long streamed generation under a deadline of --deadline-ms.
// A call that fails where it should not is reported as {"error": {...}}; the caller asserts.

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";

import { create } from "@bufbuild/protobuf";

import {
  ConnectError,
  consistencyHeaders,
  createClient,
  grpcCodeName,
  readConsistency,
  type Consistency,
  type LlmeshClient,
} from "./client.js";
import { CompleteRequestSchema, CompleteStreamRequestSchema } from "./gen/llmesh/v1/chat_pb.js";
import { CacheStatus, Role } from "./gen/llmesh/v1/common_pb.js";

const ECHOED_NAMESPACE = "node client,e2e";

interface Failure {
  code: string;
  message: string;
}

interface StreamResult extends Consistency {
  text: string;
  messages: number;
  completionTokens: number;
  // The cache_status field of the last message (the proto enum's name).
  cacheStatusField: string;
}

type Outcome<T> = T | { error: Failure };

function failure(err: unknown): Failure {
  const error = ConnectError.from(err);
  return { code: grpcCodeName(error.code), message: error.rawMessage };
}

async function streamOnce(
  client: LlmeshClient,
  prompt: string,
  timeoutMs: number,
  floors: Record<string, bigint> = {},
): Promise<Outcome<StreamResult>> {
  const request = create(CompleteStreamRequestSchema, {
    messages: [{ role: Role.USER, content: prompt }],
    sampling: { maxTokens: 16, temperature: 0 },
  });
  let trailers = new Headers();
  let text = "";
  let messages = 0;
  let completionTokens = 0;
  let cacheStatusField = CacheStatus.UNSPECIFIED;
  try {
    const stream = client.chat.completeStream(request, {
      timeoutMs,
      headers: consistencyHeaders({ versions: floors }),
      onTrailer: (received) => {
        trailers = received;
      },
    });
    for await (const message of stream) {
      messages += 1;
      for (const delta of message.deltas) {
        if (delta.index === 0) {
          text += delta.text;
        }
      }
      if (message.usage !== undefined) {
        completionTokens = message.usage.completionTokens;
      }
      cacheStatusField = message.cacheStatus;
    }
  } catch (err) {
    return { error: failure(err) };
  }
  return {
    text,
    messages,
    completionTokens,
    cacheStatusField: CacheStatus[cacheStatusField],
    ...readConsistency(trailers),
  };
}

async function unauthenticated(address: string, apiKey: string, timeoutMs: number): Promise<Failure> {
  const client = createClient(address, `${apiKey}-not-a-key`);
  try {
    const request = create(CompleteRequestSchema, {
      messages: [{ role: Role.USER, content: "Say hi." }],
      sampling: { maxTokens: 4 },
    });
    await client.chat.complete(request, { timeoutMs });
    return { code: "OK", message: "the call succeeded" };
  } catch (err) {
    return failure(err);
  } finally {
    client.close();
  }
}

async function deadline(
  client: LlmeshClient,
  deadlineMs: number,
): Promise<Failure & { deadlineMs: number; elapsedMs: number; messages: number }> {
  // A unique prompt and no cache (max-age 0, no-store): the answer has to be generated.
  const request = create(CompleteStreamRequestSchema, {
    messages: [{ role: Role.USER, content: `Write a long story about a lighthouse keeper. (${randomUUID()})` }],
    sampling: { maxTokens: 512, temperature: 0 },
  });
  const started = performance.now();
  let messages = 0;
  let outcome: Failure = { code: "OK", message: "the stream ended before its deadline" };
  try {
    const stream = client.chat.completeStream(request, {
      timeoutMs: deadlineMs,
      headers: consistencyHeaders({ maxAgeMs: 0, noStore: true }),
    });
    for await (const _ of stream) {
      messages += 1;
    }
  } catch (err) {
    outcome = failure(err);
  }
  return { ...outcome, deadlineMs, elapsedMs: Math.round(performance.now() - started), messages };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      address: { type: "string" },
      "api-key": { type: "string" },
      "deadline-ms": { type: "string", default: "100" },
      "timeout-ms": { type: "string", default: "120000" },
    },
    strict: true,
  });
  const address = values.address;
  const apiKey = values["api-key"];
  if (address === undefined || apiKey === undefined) {
    throw new Error("usage: e2e.ts --address HOST:PORT --api-key KEY [--deadline-ms N] [--timeout-ms N]");
  }
  const timeoutMs = Number(values["timeout-ms"]);
  const deadlineMs = Number(values["deadline-ms"]);
  const client = createClient(address, apiKey);
  try {
    const prompt = `Count from one to five. (${randomUUID()})`;
    const stream = await streamOnce(client, prompt, timeoutMs);
    // Read-your-writes: the repeat carries the versions the first call observed as its floors,
    // and one of a namespace of its own (percent-encoded on the wire), which the trailer echoes.
    const floors = { ...("error" in stream ? {} : stream.versions), [ECHOED_NAMESPACE]: 7n };
    const repeat = await streamOnce(client, prompt, timeoutMs, floors);
    const result = {
      stream,
      repeat,
      unauthenticated: await unauthenticated(address, apiKey, timeoutMs),
      deadline: await deadline(client, deadlineMs),
    };
    // Versions are bigints: JSON carries them as decimal strings.
    const json = JSON.stringify(result, (_, value: unknown) => (typeof value === "bigint" ? String(value) : value));
    process.stdout.write(`${json}\n`);
  } finally {
    client.close();
  }
}

await main();
