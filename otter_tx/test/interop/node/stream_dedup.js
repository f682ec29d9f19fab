// rabbitmq-stream-js-client scenario for otter_tx/test/interop/test_interop_stream_protocol.py:
// de-duplication from publishing id 0, as the client's own test suite does it
// (test/e2e/basic_publish.test.ts, "deduplication is active if create a publisher with publishRef").
//
// Usage: node stream_dedup.js HOST PORT STREAM
//
// Creates STREAM; a publisher with a reference asks its last publishing id (the server's
// sequence, 0 for a reference that wrote nothing), sends publishing ids 0..4 one by one with
// basicSend, then 0..4 again (duplicates), then id 5 as an end marker, and asks the sequence
// again; a consumer reads from first up to the marker. Prints one JSON line
// {"before": N, "after": N, "received": [...]}; exits 1 on an error.

const { Offset } = require('rabbitmq-stream-js-client');
const { connectGuest, run, sleep } = require('./streamcommon');

const [host, port, stream] = process.argv.slice(2);

async function main() {
  const client = await connectGuest(host, port);
  try {
    await client.createStream({ stream, arguments: {} });
    const publisher = await client.declarePublisher({ stream, publisherRef: 'js-dedup' });
    const before = Number(await publisher.getLastPublishingId());
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < 5; i++) {
        await publisher.basicSend(BigInt(i), Buffer.from(`m${i}-${round}`));
      }
      await publisher.flush();
    }
    await publisher.basicSend(5n, Buffer.from('end'));
    await publisher.flush();
    const received = [];
    const consumer = await client.declareConsumer(
      { stream, offset: Offset.first() },
      (message) => { received.push(message.content.toString()); },
    );
    for (let i = 0; i < 200 && !received.includes('end'); i++) await sleep(50);
    const after = Number(await publisher.getLastPublishingId());
    await client.closeConsumer(consumer.extendedId).catch(() => {});
    await client.deleteStream({ stream });
    console.log(JSON.stringify({ before, after, received }));
  } finally {
    await client.close().catch(() => {});
  }
}

run(main);
