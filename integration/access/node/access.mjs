// Google's Node.js client for Pub/Sub against the sidecar with access
// control: TLS with the sidecar's CA, and a bearer token on every call as
// gRPC call credentials. integration/access/node_test.go runs it, with the
// topic and its ordered subscription made, and reads the JSON it prints:
//
//   {"published": N, "received": [{"key", "data"}...],
//    "viewer": {"code", "details"}, "anonymous": {"code", "details"}}
//
// The publisher publishes MESSAGES_PER_KEY messages on each of KEYS
// ordering keys; the subscriber receives them all through a streaming pull
// and acks them; the viewer's publish and a publish without a token must
// fail, with the codes the test checks.
//
// Environment: JETORDER_CA (PEM file), JETORDER_GRPC (host:port),
// JETORDER_PROJECT, JETORDER_TOPIC, JETORDER_SUBSCRIPTION (ids), and
// JETORDER_TOKEN_PUBLISHER, JETORDER_TOKEN_SUBSCRIBER, JETORDER_TOKEN_VIEWER.
import { readFileSync } from 'node:fs';
import { PubSub } from '@google-cloud/pubsub';
import { grpc } from 'google-gax';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const ca = readFileSync(env('JETORDER_CA'));
const KEYS = ['key-a', 'key-b', 'key-c'];
const MESSAGES_PER_KEY = 5;

// client is a PubSub client of the sidecar sending token ("" sends none).
// sslCreds replace the client's own credentials (google-gax uses them as
// they are, without Application Default Credentials); emulatorMode: false
// keeps them for an endpoint that is not *.googleapis.com, which the
// client would otherwise take for the emulator's (plain text, no
// credentials); universeDomain says the universe, which the client would
// otherwise ask Application Default Credentials for.
function client(token) {
  let creds = grpc.credentials.createSsl(ca);
  if (token) {
    creds = grpc.credentials.combineChannelCredentials(creds,
      grpc.credentials.createFromMetadataGenerator((_params, callback) => {
        const md = new grpc.Metadata();
        md.add('authorization', `Bearer ${token}`);
        callback(null, md);
      }));
  }
  return new PubSub({
    projectId: env('JETORDER_PROJECT'),
    apiEndpoint: env('JETORDER_GRPC'),
    sslCreds: creds,
    emulatorMode: false,
    universeDomain: 'googleapis.com',
  });
}

// failure is what a publish that must fail failed with.
async function failure(pubsub, what) {
  try {
    const id = await pubsub.topic(env('JETORDER_TOPIC')).publishMessage({ data: Buffer.from('no') });
    throw new Error(`${what}: published ${id}, want an error`);
  } catch (err) {
    if (err.code === undefined) throw err;
    return { code: err.code, details: err.details ?? err.message };
  }
}

function timeout(ms, what) {
  let timer;
  const p = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not done in ${ms} ms`)), ms);
  });
  return { p, cancel: () => clearTimeout(timer) };
}

async function main() {
  const out = {};
  const clients = [];
  try {
    // Publish, in order on each key.
    const publisher = client(env('JETORDER_TOKEN_PUBLISHER'));
    clients.push(publisher);
    const topic = publisher.topic(env('JETORDER_TOPIC'), { messageOrdering: true });
    const ids = [];
    for (let i = 0; i < MESSAGES_PER_KEY; i++) {
      for (const key of KEYS) {
        ids.push(topic.publishMessage({ data: Buffer.from(`${key}-${i}`), orderingKey: key }));
      }
    }
    out.published = (await Promise.all(ids)).length;

    // Receive them all.
    const subscriber = client(env('JETORDER_TOKEN_SUBSCRIBER'));
    clients.push(subscriber);
    const sub = subscriber.subscription(env('JETORDER_SUBSCRIPTION'));
    out.received = [];
    const limit = timeout(30000, 'receive');
    try {
      await Promise.race([limit.p, new Promise((resolve, reject) => {
        sub.on('error', reject);
        sub.on('message', (m) => {
          out.received.push({ key: m.orderingKey, data: m.data.toString() });
          m.ack();
          if (out.received.length >= out.published) resolve();
        });
      })]);
    } finally {
      limit.cancel();
      await sub.close();
    }

    // The viewer may not publish; nor may a caller without a token.
    const viewer = client(env('JETORDER_TOKEN_VIEWER'));
    clients.push(viewer);
    out.viewer = await failure(viewer, 'viewer');
    const anonymous = client('');
    clients.push(anonymous);
    out.anonymous = await failure(anonymous, 'without a token');
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
  console.log(JSON.stringify(out));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
