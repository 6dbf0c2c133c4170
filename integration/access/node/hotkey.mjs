// Google's Node.js client on one hot ordering key, through
// PUBSUB_EMULATOR_HOST (plain text, no credentials): against the sidecar
// or Google's emulator. integration/access/node_test.go runs it with the
// topic and its ordered subscription made, and reads the JSON it prints:
//
//   {"received": [index...], "seconds": S, "maxInHandler": N}
//
// It publishes JETORDER_MESSAGES messages on the key "hot" (their data:
// their index), then receives until every one is acked. Each handler holds
// its message JETORDER_HOLD_MS milliseconds before acking it; maxInHandler
// is the most of the key's messages held at once. The Node client emits
// every message as it arrives, so only the server keeps it at one (strict
// ordering). JETORDER_ACK_MAX_MS, when set, is the subscriber's
// batching.maxMilliseconds: how long the client gathers acks before it
// sends them (default 100).
//
// Environment: PUBSUB_EMULATOR_HOST, JETORDER_PROJECT, JETORDER_TOPIC,
// JETORDER_SUBSCRIPTION (ids), JETORDER_MESSAGES, JETORDER_HOLD_MS, and
// optionally JETORDER_ACK_MAX_MS.
import { PubSub } from '@google-cloud/pubsub';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};

async function main() {
  const n = Number(env('JETORDER_MESSAGES'));
  const holdMs = Number(env('JETORDER_HOLD_MS'));
  const pubsub = new PubSub({ projectId: env('JETORDER_PROJECT') });
  try {
    const topic = pubsub.topic(env('JETORDER_TOPIC'), { messageOrdering: true });
    const ids = [];
    for (let i = 0; i < n; i++) {
      ids.push(topic.publishMessage({ data: Buffer.from(String(i)), orderingKey: 'hot' }));
    }
    await Promise.all(ids);

    const options = {};
    if (process.env.JETORDER_ACK_MAX_MS) {
      options.batching = { maxMilliseconds: Number(process.env.JETORDER_ACK_MAX_MS) };
    }
    const sub = pubsub.subscription(env('JETORDER_SUBSCRIPTION'), options);
    const received = [];
    const acked = new Set();
    let inHandler = 0;
    let maxInHandler = 0;
    const start = performance.now();
    try {
      await new Promise((resolve, reject) => {
        sub.on('error', reject);
        sub.on('message', (m) => {
          inHandler++;
          maxInHandler = Math.max(maxInHandler, inHandler);
          const index = Number(m.data.toString());
          received.push(index);
          setTimeout(() => {
            inHandler--;
            m.ack();
            acked.add(index);
            if (acked.size >= n) resolve();
          }, holdMs);
        });
      });
    } finally {
      await sub.close();
    }
    const seconds = (performance.now() - start) / 1000;
    console.log(JSON.stringify({ received, seconds, maxInHandler }));
  } finally {
    await pubsub.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
