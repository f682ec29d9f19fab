// Interop scenarios for otter_tx with rabbitmq/amqp091-go (Debian's
// golang-github-rabbitmq-amqp091-go-dev). Run: scenario NAME; the broker URL
// comes from OTTER_TEST_AMQP_URL. Prints one JSON object; exit 0 on success.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func name(base string) string {
	return fmt.Sprintf("%s-go-%d", base, rand.New(rand.NewSource(time.Now().UnixNano())).Int63())
}

func must(err error) {
	if err != nil {
		out(map[string]interface{}{"error": err.Error()})
		os.Exit(1)
	}
}

func out(v map[string]interface{}) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func getWithin(ch *amqp.Channel, q string, d time.Duration) (amqp.Delivery, bool) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		m, ok, err := ch.Get(q, true)
		must(err)
		if ok {
			return m, true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return amqp.Delivery{}, false
}

// seedDeadLetter is the OtterMQ TTL note's Go example (TTL 5 s shortened to 300 ms).
func seedDeadLetter(ch *amqp.Channel) map[string]interface{} {
	dlx, dlqName, mainName := name("my-dlx"), name("my-dlq"), name("my-queue")
	must(ch.ExchangeDeclare(dlx, "direct", false, true, false, false, nil))
	dlq, err := ch.QueueDeclare(dlqName, false, true, false, false, nil)
	must(err)
	must(ch.QueueBind(dlq.Name, "expired", dlx, false, nil))
	args := amqp.Table{
		"x-message-ttl":             int32(300),
		"x-dead-letter-exchange":    dlx,
		"x-dead-letter-routing-key": "expired",
	}
	mainQueue, err := ch.QueueDeclare(mainName, false, true, false, false, args)
	must(err)
	must(ch.Publish("", mainQueue.Name, false, false, amqp.Publishing{
		Body: []byte("Will expire and go to DLQ"),
	}))
	msgs, err := ch.Consume(dlq.Name, "", false, false, false, false, nil)
	must(err)
	var msg amqp.Delivery
	select {
	case msg = <-msgs:
	case <-time.After(5 * time.Second):
		must(errors.New("no dead-lettered message"))
	}
	xDeath, _ := msg.Headers["x-death"].([]interface{})
	first, _ := xDeath[0].(amqp.Table)
	count, countIsInt64 := first["count"].(int64)
	_, timeIsTime := first["time"].(time.Time)
	keys, _ := first["routing-keys"].([]interface{})
	must(msg.Ack(false))
	_, err = ch.QueueDelete(mainName, false, false, false)
	must(err)
	_, err = ch.QueueDelete(dlqName, false, false, false)
	must(err)
	must(ch.ExchangeDelete(dlx, false, false))
	return map[string]interface{}{
		"body": string(msg.Body), "reason": first["reason"], "queue": first["queue"] == mainName,
		"count": count, "countIsInt64": countIsInt64, "timeIsTimestamp": timeIsTime,
		"routingKeys": keys, "exchange": msg.Exchange == dlx, "routingKey": msg.RoutingKey,
		"firstDeathReason": msg.Headers["x-first-death-reason"],
	}
}

// perMessageTTL is the note's first Go example (Expiration "5000" shortened to "200").
func perMessageTTL(ch *amqp.Channel) map[string]interface{} {
	q, err := ch.QueueDeclare(name("my-queue"), false, true, false, false, nil)
	must(err)
	must(ch.Publish("", q.Name, false, false, amqp.Publishing{
		ContentType: "text/plain",
		Body:        []byte("This message expires soon"),
		Expiration:  "200",
	}))
	must(ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("stays")}))
	time.Sleep(400 * time.Millisecond)
	m, ok := getWithin(ch, q.Name, time.Second)
	_, ok2, err := ch.Get(q.Name, true)
	must(err)
	_, err = ch.QueueDelete(q.Name, false, false, false)
	must(err)
	return map[string]interface{}{"first": string(m.Body), "got": ok, "more": ok2}
}

// queueTTLArgument declares x-message-ttl as int32, as in the note.
func queueTTLArgument(ch *amqp.Channel) map[string]interface{} {
	args := amqp.Table{"x-message-ttl": int32(100)}
	q, err := ch.QueueDeclare(name("my-queue-with-ttl"), false, true, false, false, args)
	must(err)
	must(ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("x")}))
	time.Sleep(400 * time.Millisecond)
	q2, err := ch.QueueDeclarePassive(q.Name, false, true, false, false, args)
	must(err)
	_, err = ch.QueueDelete(q.Name, false, false, false)
	must(err)
	return map[string]interface{}{"messages": q2.Messages}
}

// confirmsAndReturns: publisher confirms, mandatory return, consume and ack.
func confirmsAndReturns(ch *amqp.Channel) map[string]interface{} {
	must(ch.Confirm(false))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 4))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	must(err)
	must(ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("hello"), DeliveryMode: 2,
		Headers: amqp.Table{"i": int32(7), "s": "str", "f": 1.5, "b": true}}))
	must(ch.Publish("", name("nowhere"), true, false, amqp.Publishing{Body: []byte("bounce")}))
	c1, c2 := <-confirms, <-confirms
	var r amqp.Return
	select {
	case r = <-returns:
	case <-time.After(5 * time.Second):
	}
	msgs, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	must(err)
	m := <-msgs
	must(m.Ack(false))
	return map[string]interface{}{
		"acks": []bool{c1.Ack, c2.Ack}, "tags": []uint64{c1.DeliveryTag, c2.DeliveryTag},
		"returnCode": r.ReplyCode, "returnText": r.ReplyText, "returned": string(r.Body),
		"body": string(m.Body), "headers": m.Headers, "deliveryMode": m.DeliveryMode,
	}
}

// notFound: a passive declare of a missing queue is a channel-level 404.
func notFound(ch *amqp.Channel) map[string]interface{} {
	q := name("missing")
	_, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
	var e *amqp.Error
	if !errors.As(err, &e) {
		must(errors.New("expected an amqp.Error"))
	}
	return map[string]interface{}{"code": e.Code, "reason": e.Reason == fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", q), "server": e.Server}
}

func main() {
	url := os.Getenv("OTTER_TEST_AMQP_URL")
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"})
	must(err)
	defer conn.Close()
	ch, err := conn.Channel()
	must(err)
	scenarios := map[string]func(*amqp.Channel) map[string]interface{}{
		"seed-dead-letter":   seedDeadLetter,
		"per-message-ttl":    perMessageTTL,
		"queue-ttl-argument": queueTTLArgument,
		"confirms-returns":   confirmsAndReturns,
		"not-found":          notFound,
	}
	f, ok := scenarios[os.Args[1]]
	if !ok {
		must(fmt.Errorf("unknown scenario %s", os.Args[1]))
	}
	out(f(ch))
}
