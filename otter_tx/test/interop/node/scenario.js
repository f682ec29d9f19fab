// amqplib interop scenarios for otter_tx/test/interop/test_interop_amqplib.py.
//
// Usage: OTTER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ node scenario.js NAME
//
// Runs one scenario against the broker, prints one JSON line
// {"ok": true, "scenario": NAME, "result": {...}} and exits 0, or prints
// {"ok": false, "scenario": NAME, "error": "..."} and exits 1.  The scenarios
// only record what they observe; the Python test asserts on the result.
// Every queue is exclusive or deleted at the end, and exchanges are
// auto-delete and deleted, because the broker may be a shared RabbitMQ.

const crypto = require('node:crypto');
const amqp = require('amqplib');

const URL = process.env.OTTER_TEST_AMQP_URL;
const SCENARIO_TIMEOUT_MS = 20000;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const uniq = (base) => `${base}-${crypto.randomBytes(5).toString('hex')}`;

// Turn an amqplib channel/connection error into {code, classId, methodId, text}.
function describeError(err) {
  const m = /with message "(.*)"$/s.exec(err.message || '');
  return {
    code: err.code,
    classId: err.classId,
    methodId: err.methodId,
    text: m ? m[1] : null,
    message: err.message,
  };
}

// Wait until predicate() is true or fail after ms.
async function until(predicate, ms = 5000, what = 'condition') {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

// Run fn(channel) on a fresh channel and return the error that closes it.
async function channelError(conn, fn) {
  const ch = await conn.createChannel();
  const closed = new Promise((resolve) => ch.on('error', resolve));
  try {
    await fn(ch);
  } catch (_err) {
    // the operation's promise rejects too; the 'error' event has the details
  }
  const err = await Promise.race([closed, sleep(5000).then(() => null)]);
  if (!err) throw new Error('channel was not closed by the broker');
  return describeError(err);
}

async function drain(ch, queue) {
  const bodies = [];
  for (;;) {
    const m = await ch.get(queue, { noAck: true });
    if (m === false) return bodies;
    bodies.push(m.content.toString());
  }
}

const scenarios = {
  // Connect, report what connection.start said, open a channel, close.
  async connect(conn) {
    const props = conn.connection.serverProperties;
    const ch = await conn.createChannel();
    const q = await ch.assertQueue('', { exclusive: true });
    await ch.close();
    return {
      capabilities: props.capabilities,
      hasProduct: typeof props.product === 'string',
      hasVersion: typeof props.version === 'string',
      frameMax: conn.connection.frameMax,
      channelMax: conn.connection.channelMax,
      heartbeat: conn.connection.heartbeat,
      queuePrefix: q.queue.slice(0, 8),
    };
  },

  // Direct exchange, bind, publish three messages, consume with acks.
  async declarePublishConsume(conn) {
    const ch = await conn.createChannel();
    const ex = uniq('node-direct');
    await ch.assertExchange(ex, 'direct', { autoDelete: true, durable: false });
    try {
      const q = await ch.assertQueue('', { exclusive: true });
      await ch.bindQueue(q.queue, ex, 'rk');
      for (let i = 0; i < 3; i++) ch.publish(ex, 'rk', Buffer.from(`m${i}`));
      ch.publish(ex, 'other', Buffer.from('dropped'));
      const got = [];
      const { consumerTag } = await ch.consume(q.queue, (msg) => {
        got.push({
          body: msg.content.toString(),
          deliveryTag: msg.fields.deliveryTag,
          redelivered: msg.fields.redelivered,
          exchange: msg.fields.exchange,
          routingKey: msg.fields.routingKey,
          consumerTag: msg.fields.consumerTag,
        });
        ch.ack(msg);
      });
      await until(() => got.length === 3, 5000, 'three deliveries');
      await sleep(100);
      await ch.cancel(consumerTag);
      const after = await ch.checkQueue(q.queue);
      return { consumerTag, got, exchange: ex, after };
    } finally {
      await ch.deleteExchange(ex);
    }
  },

  // Topic exchange patterns with * and #.
  async topicRouting(conn) {
    const ch = await conn.createChannel();
    const ex = uniq('node-topic');
    await ch.assertExchange(ex, 'topic', { autoDelete: true, durable: false });
    try {
      const patterns = ['a.*', 'a.#', '#.c', '*.b.*', '#'];
      const queues = {};
      for (const p of patterns) {
        const q = await ch.assertQueue('', { exclusive: true });
        await ch.bindQueue(q.queue, ex, p);
        queues[p] = q.queue;
      }
      for (const key of ['a', 'a.b', 'a.b.c', 'x.b.y', 'c', 'b.a']) {
        ch.publish(ex, key, Buffer.from(key));
      }
      await sleep(200);
      const routed = {};
      for (const p of patterns) routed[p] = await drain(ch, queues[p]);
      return { routed };
    } finally {
      await ch.deleteExchange(ex);
    }
  },

  // prefetch(2): at most two unacked deliveries; an ack lets one more in.
  async prefetch(conn) {
    const ch = await conn.createChannel();
    await ch.prefetch(2);
    const q = await ch.assertQueue('', { exclusive: true });
    for (let i = 0; i < 5; i++) ch.sendToQueue(q.queue, Buffer.from(`p${i}`));
    const got = [];
    await ch.consume(q.queue, (msg) => got.push(msg));
    await until(() => got.length >= 2, 5000, 'two deliveries');
    await sleep(300);
    const beforeAck = got.length;
    ch.ack(got[0]);
    await until(() => got.length >= 3, 5000, 'third delivery');
    await sleep(200);
    const afterOneAck = got.length;
    ch.ack(got[2], true); // multiple: acks p1 and p2 as well
    await until(() => got.length >= 5, 5000, 'all deliveries');
    return { beforeAck, afterOneAck, bodies: got.map((m) => m.content.toString()) };
  },

  // get, nack(requeue), get again (redelivered), reject(no requeue), get empty.
  async ackNackReject(conn) {
    const ch = await conn.createChannel();
    const q = await ch.assertQueue('', { exclusive: true });
    ch.sendToQueue(q.queue, Buffer.from('one'));
    ch.sendToQueue(q.queue, Buffer.from('two'));
    await sleep(100);
    const first = await ch.get(q.queue);
    const second = await ch.get(q.queue);
    ch.nack(second, false, true);
    ch.ack(first);
    const again = await ch.get(q.queue);
    ch.reject(again, false);
    await sleep(100);
    const empty = await ch.get(q.queue);
    const after = await ch.checkQueue(q.queue);
    return {
      first: { body: first.content.toString(), redelivered: first.fields.redelivered, messageCount: first.fields.messageCount },
      again: { body: again.content.toString(), redelivered: again.fields.redelivered },
      empty,
      messageCount: after.messageCount,
    };
  },

  // basic.get on empty and full queues.
  async get(conn) {
    const ch = await conn.createChannel();
    const q = await ch.assertQueue('', { exclusive: true });
    const empty = await ch.get(q.queue);
    ch.sendToQueue(q.queue, Buffer.from('g1'), { contentType: 'text/plain' });
    ch.sendToQueue(q.queue, Buffer.from('g2'));
    await sleep(100);
    const m = await ch.get(q.queue, { noAck: true });
    return {
      empty,
      body: m.content.toString(),
      messageCount: m.fields.messageCount,
      deliveryTag: m.fields.deliveryTag,
      routingKey: m.fields.routingKey,
      exchange: m.fields.exchange,
      contentType: m.properties.contentType,
    };
  },

  // Confirm channel: callbacks and waitForConfirms.
  async confirmChannel(conn) {
    const ch = await conn.createConfirmChannel();
    const q = await ch.assertQueue('', { exclusive: true });
    const results = [];
    for (let i = 0; i < 50; i++) {
      ch.sendToQueue(q.queue, Buffer.from(`c${i}`), {}, (err) => results.push(err ? String(err) : null));
    }
    // unroutable, not mandatory: still acked
    ch.publish('', uniq('no-such-queue'), Buffer.from('lost'), {}, (err) => results.push(err ? String(err) : null));
    await ch.waitForConfirms();
    const after = await ch.checkQueue(q.queue);
    return { confirmed: results.length, errors: results.filter((r) => r !== null), messageCount: after.messageCount };
  },

  // Mandatory unroutable publish on a confirm channel: return, then ack.
  async mandatoryReturn(conn) {
    const ch = await conn.createConfirmChannel();
    const events = [];
    ch.on('return', (msg) => {
      events.push({
        event: 'return',
        replyCode: msg.fields.replyCode,
        replyText: msg.fields.replyText,
        exchange: msg.fields.exchange,
        routingKey: msg.fields.routingKey,
        body: msg.content.toString(),
        headers: msg.properties.headers,
      });
    });
    const key = uniq('nowhere');
    await new Promise((resolve, reject) => {
      ch.publish('', key, Buffer.from('bounce'), { mandatory: true, headers: { h: 'v' } }, (err) => {
        events.push({ event: err ? 'nack' : 'ack' });
        if (err) reject(err);
        else resolve();
      });
    });
    return { key, events };
  },

  // Deleting the queue cancels the consumer: the callback gets null.
  async queueDeleteCancel(conn) {
    const ch = await conn.createChannel();
    const name = uniq('node-cancel');
    await ch.assertQueue(name, { durable: false, autoDelete: false });
    const calls = [];
    const { consumerTag } = await ch.consume(name, (msg) => calls.push(msg === null ? null : msg.content.toString()));
    const other = await conn.createChannel();
    const deleted = await other.deleteQueue(name);
    await until(() => calls.length > 0, 5000, 'cancel notification');
    // the channel survives and a later cancel of that tag is harmless
    await ch.cancel(consumerTag);
    const q = await ch.assertQueue('', { exclusive: true });
    return { calls, deletedMessageCount: deleted.messageCount, channelUsable: q.queue.startsWith('amq.gen-') };
  },

  // Error codes: 404 passive declare, 406 inequivalent, 405 exclusive
  // elsewhere, 406 unknown delivery tag, 404 publish to missing exchange.
  async errors(conn) {
    const missing = uniq('node-missing');
    const notFoundQueue = await channelError(conn, (ch) => ch.checkQueue(missing));
    const notFoundExchange = await channelError(conn, (ch) => ch.checkExchange(missing));
    const publishMissing = await channelError(conn, async (ch) => {
      ch.publish(missing, 'k', Buffer.from('x'));
    });

    const ex = uniq('node-ineq');
    const setup = await conn.createChannel();
    await setup.assertExchange(ex, 'direct', { autoDelete: true, durable: false });
    const inequivalentExchange = await channelError(conn, (ch) =>
      ch.assertExchange(ex, 'fanout', { autoDelete: true, durable: false }));
    await setup.deleteExchange(ex);

    const qname = uniq('node-ineq-q');
    await setup.assertQueue(qname, { durable: false, autoDelete: false });
    const inequivalentQueue = await channelError(conn, (ch) =>
      ch.assertQueue(qname, { durable: true, autoDelete: false }));
    await setup.deleteQueue(qname);

    const excl = await setup.assertQueue(uniq('node-excl'), { exclusive: true });
    const other = await amqp.connect(URL);
    let locked;
    try {
      locked = await channelError(other, (ch) => ch.assertQueue(excl.queue, { exclusive: true }));
    } finally {
      await other.close();
    }

    const unknownTag = await channelError(conn, async (ch) => {
      ch.ack({ fields: { deliveryTag: 99 } });
    });

    return {
      missing, exclusiveQueue: excl.queue, ineqExchange: ex, ineqQueue: qname,
      notFoundQueue, notFoundExchange, publishMissing, inequivalentExchange,
      inequivalentQueue, locked, unknownTag,
    };
  },

  // A 2 MiB message crosses many frames; report its length and hash.
  async largeMessage(conn) {
    const ch = await conn.createChannel();
    const q = await ch.assertQueue('', { exclusive: true });
    const body = crypto.randomBytes(2 * 1024 * 1024);
    ch.sendToQueue(q.queue, body);
    let received = null;
    await ch.consume(q.queue, (msg) => { received = msg.content; }, { noAck: true });
    await until(() => received !== null, 10000, 'large message');
    const h = (b) => crypto.createHash('sha256').update(b).digest('hex');
    return { sentLength: body.length, receivedLength: received.length, same: h(body) === h(received) };
  },

  // Headers of several field types and basic properties round trip.
  async headers(conn) {
    const ch = await conn.createChannel();
    const q = await ch.assertQueue('', { exclusive: true });
    ch.sendToQueue(q.queue, Buffer.from('{}'), {
      contentType: 'application/json',
      contentEncoding: 'utf-8',
      persistent: true,
      priority: 3,
      correlationId: 'corr-1',
      replyTo: 'reply-q',
      expiration: '60000',
      messageId: 'mid-1',
      timestamp: 1700000000,
      type: 'kind',
      userId: 'guest',
      appId: 'node-tests',
      headers: {
        str: 'text é',
        int: 42,
        neg: -7,
        float: 1.5,
        bool: true,
        nested: { a: 'b', n: 1 },
        list: [1, 'two', false],
      },
    });
    let m = false;
    for (let i = 0; i < 100 && m === false; i++) {
      m = await ch.get(q.queue, { noAck: true });
      if (m === false) await sleep(20);
    }
    if (m === false) throw new Error('no message');
    return { properties: m.properties };
  },

  // A headers exchange with x-match all / any.
  async headersExchange(conn) {
    const ch = await conn.createChannel();
    const ex = uniq('node-headers');
    await ch.assertExchange(ex, 'headers', { autoDelete: true, durable: false });
    try {
      const all = await ch.assertQueue('', { exclusive: true });
      const any = await ch.assertQueue('', { exclusive: true });
      await ch.bindQueue(all.queue, ex, '', { 'x-match': 'all', color: 'red', size: 1 });
      await ch.bindQueue(any.queue, ex, '', { 'x-match': 'any', color: 'red', size: 1 });
      ch.publish(ex, '', Buffer.from('both'), { headers: { color: 'red', size: 1 } });
      ch.publish(ex, '', Buffer.from('one'), { headers: { color: 'red', size: 2 } });
      ch.publish(ex, '', Buffer.from('none'), { headers: { color: 'blue' } });
      await sleep(200);
      return { all: await drain(ch, all.queue), any: await drain(ch, any.queue) };
    } finally {
      await ch.deleteExchange(ex);
    }
  },
};

async function main() {
  const name = process.argv[2];
  const scenario = scenarios[name];
  if (!URL) throw new Error('OTTER_TEST_AMQP_URL is not set');
  if (!scenario) throw new Error(`unknown scenario ${name}; known: ${Object.keys(scenarios).join(' ')}`);
  const conn = await amqp.connect(URL);
  conn.on('error', () => {});
  try {
    return await scenario(conn);
  } finally {
    await conn.close().catch(() => {});
  }
}

const timer = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, scenario: process.argv[2], error: 'scenario timed out' }));
  process.exit(1);
}, SCENARIO_TIMEOUT_MS);

main().then(
  (result) => {
    clearTimeout(timer);
    console.log(JSON.stringify({ ok: true, scenario: process.argv[2], result }));
    process.exit(0);
  },
  (err) => {
    clearTimeout(timer);
    console.log(JSON.stringify({ ok: false, scenario: process.argv[2], error: String((err && err.stack) || err) }));
    process.exit(1);
  },
);
