// rabbitmq-stream-js-client scenario for otter_tx/test/interop/test_interop_stream_protocol.py:
// a stream deleted by another protocol closes the stream protocol's publishers and consumers,
// as the client's own suite checks (test/e2e/metadata_update.test.ts, declare_publisher.test.ts,
// where the stream is deleted over the management API).
//
// Usage: OTTER_TEST_AMQP_URL=amqp://... node stream_deleted.js HOST PORT STREAM
//
// Creates STREAM, declares a publisher and a consumer on it, deletes the stream over AMQP 0-9-1
// (amqplib's deleteQueue), waits up to 3 s for the client to see it (metadata_update), then tries
// to send. Prints one JSON line {"publisherClosed": bool, "publishers": N, "consumers": N,
// "publisherCallbacks": N, "consumerCallbacks": N, "sendError": "..."}; exits 1 on an error.

const amqp = require('amqplib');
const { Offset } = require('rabbitmq-stream-js-client');
const { connectGuest, run, sleep } = require('./streamcommon');

const [host, port, stream] = process.argv.slice(2);

async function main() {
  const client = await connectGuest(host, port);
  try {
    await client.createStream({ stream, arguments: {} });
    let publisherCallbacks = 0;
    let consumerCallbacks = 0;
    const publisher = await client.declarePublisher({
      stream, connectionClosedListener: () => { publisherCallbacks++; },
    });
    await client.declareConsumer(
      { stream, offset: Offset.first(), connectionClosedListener: () => { consumerCallbacks++; } },
      () => {},
    );
    const conn = await amqp.connect(process.env.OTTER_TEST_AMQP_URL);
    try {
      const ch = await conn.createChannel();
      await ch.deleteQueue(stream);
    } finally {
      await conn.close().catch(() => {});
    }
    for (let i = 0; i < 60 && !(publisher.closed && client.consumerCounts() === 0); i++) await sleep(50);
    let sendError = null;
    try {
      await publisher.send(Buffer.from('after'));
    } catch (e) {
      sendError = String(e && e.message || e);
    }
    console.log(JSON.stringify({
      publisherClosed: publisher.closed, publishers: client.publisherCounts(),
      consumers: client.consumerCounts(), publisherCallbacks, consumerCallbacks, sendError,
    }));
  } finally {
    await client.close().catch(() => {});
  }
}

run(main);
