// What the rabbitmq-stream-js-client scenarios (stream*.js) share: a guest connection to
// HOST:PORT whose address resolver keeps the client on that listener, a sleep, and the
// main() runner (exit 0 when it resolves, 1 on an error or after a time limit).

const { connect } = require('rabbitmq-stream-js-client');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function connectGuest(host, port) {
  return connect({
    hostname: host, port: Number(port), username: 'guest', password: 'guest', vhost: '/',
    addressResolver: { enabled: true, endpoint: { host, port: Number(port) } },
  });
}

function run(main, limitMs = 30000) {
  const timer = setTimeout(() => { console.error('timeout'); process.exit(1); }, limitMs);
  main().then(() => { clearTimeout(timer); process.exit(0); })
    .catch((e) => { console.error(e && e.stack || e); process.exit(1); });
}

module.exports = { sleep, connectGuest, run };
