// amqplib client of otter_tx's scheduled (delayed) messages, for
// otter_tx/test/interop/test_interop_scheduled.py and the example in docs/delayed.md.
//
// Usage: OTTER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ node scheduled.js
//
// Declares an auto-delete x-delayed-message exchange, holds three messages
// (two with x-delay, one with x-delay-until), then over the exchange's
// x-delayed-command RPC (direct reply-to) lists them, cancels one by id and
// one by message_id, lists again, and receives the one left when it fires.
// Prints one JSON line {"ok": true, "result": {...}} and exits 0, or
// {"ok": false, "error": "..."} and exits 1.  The Python test asserts.

const crypto = require('node:crypto');
const amqp = require('amqplib');

const URL = process.env.OTTER_TEST_AMQP_URL;

// Send one command to the delayed exchange and wait for its JSON answer.
function command(ch, exchange, pending, name, args) {
  const correlationId = crypto.randomBytes(8).toString('hex');
  const answer = new Promise((resolve) => pending.set(correlationId, resolve));
  ch.publish(exchange, '', Buffer.from(JSON.stringify(args || {})), {
    headers: { 'x-delayed-command': name },
    replyTo: 'amq.rabbitmq.reply-to',
    correlationId,
  });
  return answer;
}

async function main() {
  const conn = await amqp.connect(URL);
  try {
    const ch = await conn.createChannel();
    const exchange = `sched-${crypto.randomBytes(5).toString('hex')}`;
    await ch.assertExchange(exchange, 'x-delayed-message', {
      autoDelete: true, arguments: { 'x-delayed-type': 'direct' },
    });
    const { queue } = await ch.assertQueue('', { exclusive: true });
    await ch.bindQueue(queue, exchange, 'job');

    // answers to commands arrive on the direct reply-to pseudo-queue
    const pending = new Map();
    await ch.consume('amq.rabbitmq.reply-to', (m) => {
      const resolve = pending.get(m.properties.correlationId);
      pending.delete(m.properties.correlationId);
      resolve({ status: m.properties.headers['x-delayed-status'], body: JSON.parse(m.content.toString()) });
    }, { noAck: true });

    ch.publish(exchange, 'job', Buffer.from('a'), { headers: { 'x-delay': 60000 }, messageId: 'order-1' });
    ch.publish(exchange, 'job', Buffer.from('b'), { headers: { 'x-delay': 30000 } });
    ch.publish(exchange, 'job', Buffer.from('c'), { headers: { 'x-delay-until': Date.now() + 1500 } });

    const before = await command(ch, exchange, pending, 'list', { page: 1, page_size: 10 });
    const b = before.body.items[1]; // in due order: c, b, a
    const byId = await command(ch, exchange, pending, 'cancel', { id: b.id });
    const byMessageId = await command(ch, exchange, pending, 'cancel', { message_id: 'order-1' });
    const missing = await command(ch, exchange, pending, 'cancel', { id: b.id });
    const after = await command(ch, exchange, pending, 'list', {});

    // the x-delay-until message fires and carries its broker id
    let fired = null;
    const deadline = Date.now() + 5000;
    while (!fired && Date.now() < deadline) {
      const m = await ch.get(queue, { noAck: true });
      if (m) fired = { body: m.content.toString(), id: String(m.properties.headers['x-delayed-id']) };
      else await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const purge = await command(ch, exchange, pending, 'purge');
    await ch.deleteExchange(exchange);
    return {
      before: before.body.items.map((i) => i.id), beforeStatus: before.status, total: before.body.total_count,
      cancelled: b.id, byId, byMessageId, missing,
      after: after.body.items.map((i) => i.id), fired, purge,
    };
  } finally {
    await conn.close().catch(() => {});
  }
}

const timer = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, error: 'timed out' }));
  process.exit(1);
}, 20000);

main().then(
  (result) => {
    clearTimeout(timer);
    console.log(JSON.stringify({ ok: true, result }));
    process.exit(0);
  },
  (err) => {
    clearTimeout(timer);
    console.log(JSON.stringify({ ok: false, error: String((err && err.stack) || err) }));
    process.exit(1);
  },
);
