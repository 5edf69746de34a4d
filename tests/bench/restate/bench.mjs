// The kernel benchmark's workload on Restate: N no-op calls in sequence, then N at once.
//
//   node bench.mjs --admin http://127.0.0.1:9070 --ingress http://127.0.0.1:8080 --n 300
//
// Run by tests/bench/compare.sh against a fresh single-node `restate-server` (default settings,
// so its log and partition store fsync their writes). This process serves the services of
// service.mjs over HTTP/2 on a free local port, registers that deployment with the admin API
// (POST /deployments), then calls `bench.sequential` and `bench.atOnce` through the ingress, each
// once with 5 calls as a warm-up and once timed, from request to response. It prints one JSON
// object on stdout, shaped like temporal_bench.py's.
import http2 from "node:http2";
import { createRequire } from "node:module";
import { parseArgs } from "node:util";
import * as restate from "@restatedev/restate-sdk";
import { services } from "./service.mjs";

const { values: args } = parseArgs({
  options: {
    admin: { type: "string", default: "http://127.0.0.1:9070" },
    ingress: { type: "string", default: "http://127.0.0.1:8080" },
    n: { type: "string", default: "300" },
    warmup: { type: "string", default: "5" },
  },
});
const n = Number.parseInt(args.n, 10);
const warmup = Number.parseInt(args.warmup, 10);
if (!(n > 0) || !(warmup >= 0)) {
  console.error("bench.mjs: --n must be a positive integer");
  process.exit(2);
}
const log = (msg) => console.error(`restate-bench: ${msg}`);

async function post(url, body, headers = {}) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, text };
}

async function serveEndpoint() {
  const server = http2.createServer(restate.createEndpointHandler({ services }));
  await new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  return server;
}

async function register(port) {
  const { status, text } = await post(`${args.admin}/deployments`, {
    uri: `http://127.0.0.1:${port}/`,
    force: true,
  });
  if (status < 200 || status >= 300) {
    throw new Error(`registering the deployment answered ${status}: ${text}`);
  }
  return JSON.parse(text);
}

async function invoke(handler, count) {
  const started = performance.now();
  const { status, text } = await post(`${args.ingress}/bench/${handler}`, count);
  const elapsed = (performance.now() - started) / 1000;
  if (status !== 200) {
    throw new Error(`bench/${handler}(${count}) answered ${status}: ${text}`);
  }
  const done = JSON.parse(text);
  if (done !== count) throw new Error(`bench/${handler} returned ${text}, expected ${count}`);
  return elapsed;
}

// The ingress learns of a new deployment shortly after the admin API accepts it.
async function firstInvoke(handler, count, seconds) {
  const deadline = performance.now() + seconds * 1000;
  for (;;) {
    try {
      return await invoke(handler, count);
    } catch (error) {
      if (performance.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }
}

const require = createRequire(import.meta.url);
const sdkVersion = require("@restatedev/restate-sdk/package.json").version;

const server = await serveEndpoint();
try {
  const port = server.address().port;
  const deployment = await register(port);
  const version = await fetch(`${args.admin}/version`)
    .then((r) => r.json())
    .catch(() => ({}));
  log(`deployment ${deployment.id} at port ${port}; server ${version.version ?? "?"}, SDK ${sdkVersion}`);

  if (warmup > 0) {
    await firstInvoke("sequential", warmup, 30);
    await invoke("atOnce", warmup);
  } else {
    await firstInvoke("sequential", 1, 30);
  }
  const sequential = await invoke("sequential", n);
  const atOnce = await invoke("atOnce", n);
  console.log(
    JSON.stringify({
      n,
      server_version: version.version ?? null,
      sdk_version: sdkVersion,
      sequential_s: sequential,
      sequential_ms_per_call: (sequential * 1000) / n,
      concurrent_s: atOnce,
      concurrent_calls_per_s: n / atOnce,
    }),
  );
} finally {
  server.close();
  // Restate keeps HTTP/2 connections to the endpoint open; don't wait for it to drop them.
  setTimeout(() => process.exit(process.exitCode ?? 0), 200).unref();
}
