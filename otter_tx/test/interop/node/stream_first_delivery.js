// rabbitmq-stream-js-client scenario for otter_tx/test/interop/test_interop_stream_protocol.py:
// a consumer's handler uses the consumer declareConsumer returned, as the client's own suite does
// (test/e2e/offset.test.ts, "the consumer is able to track the offset and start from the stored
// offset": it calls consumer.storeOffset in the handler). The client runs the handler for a
// chunk read together with the subscribe response before declareConsumer returns, so the broker
// must send the response first, in a write of its own (RabbitMQ sends them in two).
//
// Usage: node stream_first_delivery.js HOST PORT STREAM
//
// Creates STREAM, publishes hello, marker, hello, world; a consumer from first stores the
// marker's offset through `consumer` in its handler; a second consumer starts at the stored
// offset. Prints one JSON line {"early": N, "stored": N, "second": [...]} (early: handler calls
// before declareConsumer returned); exits 1 on an error.

const { Offset } = require('rabbitmq-stream-js-client');
const { connectGuest, run, sleep } = require('./streamcommon');

const [host, port, stream] = process.argv.slice(2);

async function main() {
  const client = await connectGuest(host, port);
  try {
    await client.createStream({ stream, arguments: {} });
    const publisher = await client.declarePublisher({ stream });
    for (const m of ['hello', 'marker', 'hello', 'world']) await publisher.send(Buffer.from(m));
    await publisher.flush();
    await sleep(200);
    let early = 0;
    let consumer = null;
    let seen = 0;
    consumer = await client.declareConsumer(
      { stream, offset: Offset.first(), consumerRef: 'js-first' },
      async (message) => {
        seen++;
        if (consumer === null) {
          early++;
          return;
        }
        if (message.content.toString() === 'marker') await consumer.storeOffset(message.offset);
      },
    );
    let stored = null;
    for (let i = 0; i < 100 && stored === null; i++) {
      try {
        stored = Number(await client.queryOffset({ reference: 'js-first', stream }));
      } catch (e) {
        await sleep(30);
      }
    }
    await client.closeConsumer(consumer.extendedId).catch(() => {});
    const second = [];
    if (stored !== null) {
      const again = await client.declareConsumer(
        { stream, offset: Offset.offset(BigInt(stored)) },
        (message) => { second.push(message.content.toString()); },
      );
      for (let i = 0; i < 100 && second.length < 3; i++) await sleep(30);
      await client.closeConsumer(again.extendedId).catch(() => {});
    }
    await client.deleteStream({ stream });
    console.log(JSON.stringify({ early, seen, stored, second }));
  } finally {
    await client.close().catch(() => {});
  }
}

run(main);
