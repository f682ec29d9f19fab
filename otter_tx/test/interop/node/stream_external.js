// rabbitmq-stream-js-client scenario for otter_tx/test/interop/test_interop_tls.py: SASL EXTERNAL over
// TLS with a client certificate, as the client's own suite does (test/e2e/connect.test.ts, "using
// EXTERNAL auth").
//
// Usage: node stream_external.js HOST PORT STREAM CA CERT KEY
//
// Connects with mechanism EXTERNAL (no user name or password), creates and deletes STREAM, and
// prints one JSON line {"created": true}; exits 1 on an error (a refused login too: the client
// throws it from its socket handler).

const fs = require('fs');
const { connect } = require('rabbitmq-stream-js-client');
const { run } = require('./streamcommon');

const [host, port, stream, ca, cert, key] = process.argv.slice(2);

async function main() {
  const client = await connect({
    hostname: host, port: Number(port), mechanism: 'EXTERNAL', username: '', password: '', vhost: '/',
    ssl: { ca: fs.readFileSync(ca, 'utf8'), cert: fs.readFileSync(cert, 'utf8'), key: fs.readFileSync(key, 'utf8'),
      servername: 'localhost' },
    addressResolver: { enabled: true, endpoint: { host, port: Number(port) } },
  });
  try {
    await client.createStream({ stream, arguments: {} });
    await client.deleteStream({ stream });
    console.log(JSON.stringify({ created: true }));
  } finally {
    await client.close().catch(() => {});
  }
}

run(main);
