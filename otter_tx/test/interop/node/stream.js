// rabbitmq-stream-js-client scenario for otter_tx/test/interop/test_interop_stream_protocol.py.
//
// Usage: node stream.js HOST PORT STREAM
//
// Creates STREAM, publishes m0..m4 with a publisher reference (de-duplication on), waits
// for the confirms, consumes from first, stores offset 3 under a consumer name and reads it
// back, deletes the stream, and prints one JSON line
// {"received": [...], "offsets": [...], "storedOffset": N, "emptyStats": {...}, "stats": {...}}
// (stream_stats before the publishes and after them); exits 1 on an error.

const { Offset } = require('rabbitmq-stream-js-client');
const { connectGuest, run, sleep } = require('./streamcommon');

const [host, port, stream] = process.argv.slice(2);
const numbers = (stats) => Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, Number(v)]));

async function main() {
  const client = await connectGuest(host, port);
  try {
    await client.createStream({ stream, arguments: {} });
    const emptyStats = numbers(await client.streamStatsRequest(stream));
    const publisher = await client.declarePublisher({ stream, publisherRef: 'js-pub' });
    for (let i = 0; i < 5; i++) {
      await publisher.send(Buffer.from(`m${i}`));
    }
    await publisher.flush();
    const received = [];
    const offsets = [];
    const consumer = await client.declareConsumer(
      { stream, offset: Offset.first(), consumerRef: 'js-consumer' },
      (message) => { received.push(message.content.toString()); offsets.push(Number(message.offset)); },
    );
    for (let i = 0; i < 200 && received.length < 5; i++) await sleep(50);
    const stats = numbers(await client.streamStatsRequest(stream));
    await consumer.storeOffset(3n);
    let storedOffset = null;
    for (let i = 0; i < 100 && storedOffset === null; i++) {
      try {
        storedOffset = Number(await client.queryOffset({ reference: 'js-consumer', stream }));
      } catch (e) {
        await sleep(50);
      }
    }
    await client.closeConsumer(consumer.extendedId).catch(() => {});
    await client.deleteStream({ stream });
    console.log(JSON.stringify({ received, offsets, storedOffset, emptyStats, stats }));
  } finally {
    await client.close().catch(() => {});
  }
}

run(main);
