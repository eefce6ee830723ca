package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The benchmarks' like-for-like pair: two clients of equal weight, one over HTTP (net/http)
// and one over MQTT (a raw paho v5 client, no SDK), that encode a request the same way
// (encoding/json of the same JSON-RPC request, ids filled in by the client) and decode each
// reply with the same code (rawEvent: the JSON-RPC envelope and its result into a2a-go types,
// one json.Unmarshal). What differs between them is the transport alone: an HTTP round trip
// through the gateway against a publish and a correlated reply on the bus.

// rawRequest encodes a JSON-RPC request for method with a fresh message (task, context and
// message ids filled in, as the profile makes a requester do).
func rawRequest(id int64, method, text string) ([]byte, error) {
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	msg.TaskID, msg.ContextID = a2a.TaskID(uuid.NewString()), uuid.NewString()
	return json.Marshal(struct {
		JSONRPC string                  `json:"jsonrpc"`
		ID      int64                   `json:"id"`
		Method  string                  `json:"method"`
		Params  *a2a.SendMessageRequest `json:"params"`
	}{"2.0", id, method, &a2a.SendMessageRequest{Message: msg}})
}

// rawEvent decodes one JSON-RPC response carrying an event (a SendMessage result or a stream's
// event) into a2a-go types.
func rawEvent(payload []byte) (a2a.Event, error) {
	var env struct {
		Result *a2a.StreamResponse `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return nil, fmt.Errorf("decode reply: %w", err)
	}
	if env.Error != nil {
		return nil, fmt.Errorf("JSON-RPC error %d: %s", env.Error.Code, env.Error.Message)
	}
	if env.Result == nil || env.Result.Event == nil {
		return nil, errors.New("reply without result")
	}
	return env.Result.Event, nil
}

// endsStream reports whether ev is a stream's last event (a terminal or interrupted state).
func endsStream(ev a2a.Event) bool {
	switch v := ev.(type) {
	case *a2a.Message:
		return true
	case *a2a.Task:
		return v.Status.State.Terminal() || v.Status.State == a2a.TaskStateInputRequired
	case *a2a.TaskStatusUpdateEvent:
		return v.Status.State.Terminal() || v.Status.State == a2a.TaskStateInputRequired
	}
	return false
}

// rawHTTP is net/http's client posting JSON-RPC requests to one agent's endpoint.
type rawHTTP struct {
	hc       *http.Client
	endpoint string
	auth     string
	seq      atomic.Int64
	// newConns counts the calls that did not reuse a kept-alive connection, chunked the
	// SendMessage responses that came without a Content-Length.
	newConns, chunked atomic.Int64
	// decode reads one JSON-RPC response: rawEvent, or the SDK's a2amqtt.DecodeResponse (the
	// requester's own one-pass decoder) to weigh the same as the SDK's requester.
	decode func([]byte) (a2a.Event, error)
	// firstEvent holds each stream's time from the request to its first event decoded;
	// bodyReads counts the reads of the streams' bodies (each a chunk of the response or less:
	// how many events the gateway's writes carried together).
	firstEvent []time.Duration
	bodyReads  atomic.Int64
}

// countedBody counts the reads of a response body.
type countedBody struct {
	io.Reader
	reads *atomic.Int64
}

func (c countedBody) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Reader.Read(p)
}

func newRawHTTP(gatewayURL, agent, token string) *rawHTTP {
	return &rawHTTP{
		hc:       &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: time.Minute},
		endpoint: fmt.Sprintf("%s/agents/%s/%s/%s/", gatewayURL, org, unit, agent),
		auth:     "Bearer " + token,
		decode:   rawEvent,
	}
}

func (c *rawHTTP) post(ctx context.Context, method, text string) (*http.Response, error) {
	body, err := rawRequest(c.seq.Add(1), method, text)
	if err != nil {
		return nil, err
	}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if !info.Reused {
			c.newConns.Add(1)
		}
	}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", c.auth)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, raw)
	}
	return resp, nil
}

// send makes one SendMessage call.
func (c *rawHTTP) send(ctx context.Context, text string) (a2a.Event, error) {
	resp, err := c.post(ctx, a2amqtt.MethodSendMessage, text)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.ContentLength < 0 {
		c.chunked.Add(1)
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return c.decode(raw)
}

// stream makes one SendStreamingMessage call and reads its SSE events (one "data:" line each, as
// a2a-go's server and the gateway write them) until the stream's last; it returns their count.
func (c *rawHTTP) stream(ctx context.Context, text string) (int, error) {
	start := time.Now()
	resp, err := c.post(ctx, a2amqtt.MethodSendStreamingMessage, text)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	r, n := bufio.NewReaderSize(countedBody{resp.Body, &c.bodyReads}, 16<<10), 0
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return n, fmt.Errorf("after %d events: %w", n, err)
		}
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		ev, err := c.decode(data)
		if err != nil {
			return n, err
		}
		if n++; n == 1 {
			c.firstEvent = append(c.firstEvent, time.Since(start))
		}
		if endsStream(ev) {
			return n, nil
		}
	}
}

// rawMQTT is a raw paho v5 client (brokertest's: no SDK) publishing JSON-RPC requests to one
// agent's request topic, QoS 1, with its reply topic and a correlation id, and reading the
// correlated replies.
type rawMQTT struct {
	c            *brokertest.Client
	topic, reply string
	seq          int64
	// firstEvent holds each stream's time from the request to its first event decoded.
	firstEvent []time.Duration
}

// rawMQTTAs connects fleet agent name as a raw MQTT requester of agent.
func (st *stack) rawMQTTAs(t testing.TB, name, agent string) *rawMQTT {
	t.Helper()
	u, err := url.Parse(st.brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	c := brokertest.MustDial(t, u.Host, brokertest.Options{Username: st.usernames[name], Password: st.passwords[name], ClientID: ref(name).ClientID()})
	reply := ref(name).ReplyTopic("raw")
	if rc := c.Subscribe(reply); rc >= 0x80 {
		t.Fatalf("subscribe %s: %#x", reply, rc)
	}
	return &rawMQTT{c: c, topic: ref(agent).RequestTopic(), reply: reply}
}

func (m *rawMQTT) publish(method, text string) ([]byte, error) {
	m.seq++
	body, err := rawRequest(m.seq, method, text)
	if err != nil {
		return nil, err
	}
	corr := strconv.AppendInt(nil, m.seq, 10)
	pr, err := m.c.PublishWith(&paho.Publish{Topic: m.topic, QoS: 1, Payload: body, Properties: &paho.PublishProperties{
		ResponseTopic: m.reply, CorrelationData: corr, ContentType: "application/json"}})
	if err != nil {
		return nil, err
	}
	if pr.ReasonCode >= 0x80 {
		return nil, fmt.Errorf("publish to %s: reason %#x", m.topic, pr.ReasonCode)
	}
	return corr, nil
}

// next is the next reply correlated with corr (an earlier call's late replies are dropped).
func (m *rawMQTT) next(ctx context.Context, corr []byte) (a2a.Event, error) {
	for {
		select {
		case p := <-m.c.Messages():
			if bytes.Equal(p.Properties.CorrelationData, corr) {
				return rawEvent(p.Payload)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// send makes one SendMessage call.
func (m *rawMQTT) send(ctx context.Context, text string) (a2a.Event, error) {
	corr, err := m.publish(a2amqtt.MethodSendMessage, text)
	if err != nil {
		return nil, err
	}
	return m.next(ctx, corr)
}

// stream makes one SendStreamingMessage call and reads its replies until the stream's last; it
// returns their count.
func (m *rawMQTT) stream(ctx context.Context, text string) (int, error) {
	start := time.Now()
	corr, err := m.publish(a2amqtt.MethodSendStreamingMessage, text)
	if err != nil {
		return 0, err
	}
	for n := 1; ; n++ {
		ev, err := m.next(ctx, corr)
		if err != nil {
			return n - 1, err
		}
		if n == 1 {
			m.firstEvent = append(m.firstEvent, time.Since(start))
		}
		if endsStream(ev) {
			return n, nil
		}
	}
}
