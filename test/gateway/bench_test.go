package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// BenchmarkGatewayOverhead measures what the gateway adds to a call: each iteration sends one
// SendMessage to the same MQTT agent ("direct", not governed) from an MQTT client (the SDK's
// requester) and from an HTTP client (a2a-go's JSON-RPC client through the gateway), interleaved
// so that both see the same load; it reports both medians and their ratio (docs/benchmarks.md).
//
//	go test ./test/gateway -run '^$' -bench GatewayOverhead -benchtime 400x
func BenchmarkGatewayOverhead(b *testing.B) {
	for _, kind := range []string{"mosquitto", "embedded"} {
		b.Run(kind, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			st := newStack(b, ctx, kind, startHTTPAgent(b))
			st.startMQTTAgent(b, ctx, "direct", false)
			var marks callMarks
			st.wrap = marks.wrap
			gw, _ := st.gateway(b, ctx)
			viaHTTP, card := httpClient(b, ctx, gw, "direct", st.token(b, ctx, "caller"))
			viaMQTT := st.requesterAs(b, ctx, "mqttclient").Transport(ref("direct"))
			// The floor: the same HTTP client and call against a JSON-RPC endpoint that answers
			// at once with the agent's own reply (no gateway, no bus): the HTTP hop alone.
			canned, err := viaMQTT.SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "hello"))
			if err != nil {
				b.Fatal(err)
			}
			viaFloor := floorClient(b, ctx, card, a2a.StreamResponse{Event: canned}, st.token(b, ctx, "caller"))
			call := func(send func() (a2a.SendMessageResult, error)) time.Duration {
				start := time.Now()
				res, err := send()
				d := time.Since(start)
				if task, ok := res.(*a2a.Task); err != nil || !ok || task.Status.State != a2a.TaskStateCompleted {
					b.Fatalf("call: %v %v", res, err)
				}
				return d
			}
			// Warm both paths (the gateway's caller connection is made on first use).
			for range 5 {
				call(func() (a2a.SendMessageResult, error) {
					return viaHTTP.SendMessage(ctx, userMsg(uuid.NewString(), "", "warm"))
				})
				call(func() (a2a.SendMessageResult, error) {
					return viaMQTT.SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "warm"))
				})
				call(func() (a2a.SendMessageResult, error) {
					return viaFloor.SendMessage(ctx, userMsg(uuid.NewString(), "", "warm"))
				})
			}
			mq, ht, fl := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				mq = append(mq, call(func() (a2a.SendMessageResult, error) {
					return viaMQTT.SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "hello"))
				}))
				ht = append(ht, call(func() (a2a.SendMessageResult, error) {
					return marks.timed(ctx, func(ctx context.Context) (a2a.SendMessageResult, error) {
						return viaHTTP.SendMessage(ctx, userMsg(uuid.NewString(), "", "hello"))
					})
				}))
				fl = append(fl, call(func() (a2a.SendMessageResult, error) {
					return viaFloor.SendMessage(ctx, userMsg(uuid.NewString(), "", "hello"))
				}))
			}
			b.StopTimer()
			slices.Sort(mq)
			slices.Sort(ht)
			slices.Sort(fl)
			p50m, p50h, p50f := mq[len(mq)/2], ht[len(ht)/2], fl[len(fl)/2]
			b.ReportMetric(float64(p50m.Microseconds()), "mqtt-p50-µs")
			b.ReportMetric(float64(p50h.Microseconds()), "http-p50-µs")
			b.ReportMetric(float64(p50h)/float64(p50m), "http/mqtt")
			// What the gateway adds beyond the hop, and the ratio a gateway that added nothing
			// but the hop would reach.
			b.ReportMetric(float64(p50f.Microseconds()), "hop-p50-µs")
			b.ReportMetric(float64(p50m+p50f)/float64(p50m), "hop-only-ratio")
			marks.report(b)
		})
	}
}

// streamer answers every message with n artifact updates, then completes.
type streamer struct{ n int }

func (s streamer) Execute(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, nil), nil) {
			return
		}
		for i := range s.n {
			if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(fmt.Sprintf("chunk %d", i))), nil) {
				return
			}
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
	}
}

func (streamer) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

// BenchmarkGatewayStreaming measures streaming through the gateway: each iteration streams 200
// artifact updates from the same MQTT agent (an SDK responder) to an MQTT client and, through
// the gateway, to a2a-go's HTTP client (SSE), interleaved; it reports both event rates and
// their ratio (docs/benchmarks.md).
//
//	go test ./test/gateway -run '^$' -bench GatewayStreaming -benchtime 50x
func BenchmarkGatewayStreaming(b *testing.B) {
	const events = 200
	for _, kind := range []string{"mosquitto", "embedded"} {
		b.Run(kind, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			st := newStack(b, ctx, kind, startHTTPAgent(b))
			conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: st.brokerURL, Username: st.usernames["direct"], Password: st.passwords["direct"], Agent: ref("direct")})
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close(context.Background())
			resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{Executor: streamer{n: events}})
			if err != nil {
				b.Fatal(err)
			}
			defer resp.Close(context.Background())
			gw, _ := st.gateway(b, ctx)
			viaHTTP, _ := httpClient(b, ctx, gw, "direct", st.token(b, ctx, "caller"))
			viaMQTT := st.requesterAs(b, ctx, "mqttclient").Transport(ref("direct"))
			stream := func(seq iter.Seq2[a2a.Event, error]) time.Duration {
				start, n := time.Now(), 0
				for _, err := range seq {
					if err != nil {
						b.Fatalf("stream: %v", err)
					}
					n++
				}
				if n < events+2 {
					b.Fatalf("stream: %d events, want %d", n, events+2)
				}
				return time.Since(start)
			}
			var mq, ht time.Duration
			b.ResetTimer()
			for range b.N {
				mq += stream(viaMQTT.SendStreamingMessage(ctx, nil, userMsg(uuid.NewString(), "", "go")))
				ht += stream(viaHTTP.SendStreamingMessage(ctx, userMsg(uuid.NewString(), "", "go")))
			}
			b.StopTimer()
			perSecond := func(d time.Duration) float64 { return float64(events*b.N) / d.Seconds() }
			b.ReportMetric(perSecond(mq), "mqtt-events/s")
			b.ReportMetric(perSecond(ht), "http-events/s")
			b.ReportMetric(perSecond(ht)/perSecond(mq), "http/mqtt")
		})
	}
}

// floorClient is a2a-go's HTTP client (as httpClient makes it, token included) for a JSON-RPC
// endpoint on loopback that reads each request's envelope and answers it with result, encoded
// once beforehand: an HTTP round trip with no gateway and no bus behind it.
func floorClient(b *testing.B, ctx context.Context, card *a2a.AgentCard, result a2a.StreamResponse, token string) *a2aclient.Client {
	b.Helper()
	encoded, err := json.Marshal(result)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env struct {
			ID json.RawMessage `json:"id"`
		}
		body, err := io.ReadAll(r.Body)
		if err != nil || json.Unmarshal(body, &env) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		out := append([]byte(`{"jsonrpc":"2.0","id":`), env.ID...)
		out = append(out, `,"result":`...)
		out = append(out, encoded...)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(out, "}\n"...))
	}))
	b.Cleanup(srv.Close)
	floor := *card
	floor.SupportedInterfaces = []*a2a.AgentInterface{a2a.NewAgentInterface(srv.URL+"/", a2a.TransportProtocolJSONRPC)}
	hc := &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}, Timeout: time.Minute}
	c, err := a2aclient.NewFromCard(ctx, &floor, a2aclient.WithJSONRPCTransport(hc))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Destroy() })
	return c
}

// callMarks times the steps of one HTTP call through the gateway, everything in one process
// (monotonic clock): the client's request written, the gateway's handler entered and left, the
// response's first byte read, the client's call returned. It reports each step's median.
type callMarks struct {
	entered, left atomic.Int64 // handler, ns since start
	start         time.Time
	steps         [5][]time.Duration
}

func (m *callMarks) since() int64 { return int64(time.Since(m.start)) }

func (m *callMarks) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.entered.Store(m.since())
		next.ServeHTTP(w, r)
		m.left.Store(m.since())
	})
}

// timed runs one call and records its steps.
func (m *callMarks) timed(ctx context.Context, send func(context.Context) (a2a.SendMessageResult, error)) (a2a.SendMessageResult, error) {
	m.start = time.Now()
	m.entered.Store(0)
	m.left.Store(0)
	var wrote, firstByte atomic.Int64
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote.Store(m.since()) },
		GotFirstResponseByte: func() { firstByte.Store(m.since()) },
	})
	res, err := send(ctx)
	done := m.since()
	marks := []int64{0, wrote.Load(), m.entered.Load(), m.left.Load(), firstByte.Load(), done}
	for i := range m.steps {
		m.steps[i] = append(m.steps[i], time.Duration(marks[i+1]-marks[i]))
	}
	return res, err
}

func (m *callMarks) report(b *testing.B) {
	names := [5]string{"encode+write", "to-handler", "handler", "to-client", "read+decode"}
	for i, ds := range m.steps {
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2])/1e3, "step-"+names[i]+"-µs")
	}
}
