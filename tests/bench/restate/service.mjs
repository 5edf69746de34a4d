// The kernel benchmark's workload as Restate services (SDK @restatedev/restate-sdk 1.14.x).
//
// `tools.noop` is the tool: a handler that does nothing, run by this endpoint as Restate calls it.
// `bench.sequential(n)` makes n durable service-to-service calls to it, each awaited before the
// next; `bench.atOnce(n)` starts n such calls and awaits them all. Every call is journaled by the
// caller's invocation and runs as an invocation of its own, as a tool call dispatched to a worker.
import * as restate from "@restatedev/restate-sdk";

export const tools = restate.service({
  name: "tools",
  handlers: {
    noop: async (_ctx) => null,
  },
});

export const bench = restate.service({
  name: "bench",
  handlers: {
    sequential: async (ctx, n) => {
      const client = ctx.serviceClient(tools);
      for (let i = 0; i < n; i++) {
        await client.noop();
      }
      return n;
    },
    atOnce: async (ctx, n) => {
      const client = ctx.serviceClient(tools);
      const calls = [];
      for (let i = 0; i < n; i++) {
        calls.push(client.noop());
      }
      await restate.RestatePromise.all(calls);
      return n;
    },
  },
});

export const services = [tools, bench];
