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
// SendMessage to the same MQTT agent ("direct", not governed) from two pairs of clients,
// interleaved so that all see the same load, and reports each pair's medians and their ratio
// (docs/benchmarks.md): the SDK's requester over MQTT against a2a-go's JSON-RPC client through
// the gateway (what a user of each sees), and a raw paho client against net/http, both with the
// same request encoding and reply decoding (rawclients_test.go: the transports alone); and
// net/http with the SDK's own decoder against the SDK's requester. A further call for each of
// the first two HTTP clients, against an endpoint that answers at once from memory, is the HTTP
// hop alone.
//
//	go test ./test/gateway -run '^$' -bench GatewayOverhead -benchtime 400x
func BenchmarkGatewayOverhead(b *testing.B) {
	for _, kind := range []string{"mosquitto", "embedded"} {
		b.Run(kind, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			st := newStack(b, ctx, kind, startHTTPAgent(b))
			st.startMQTTAgent(b, ctx, "direct", false)
			// The governed path: the same agent behind the conversation service (a policy, the
			// service's admission and history), reached the same way by both transports.
			st.startMQTTAgent(b, ctx, "memory", true)
			marks := newCallMarks()
			st.wrap = marks.wrap
			gw, _ := st.gateway(b, ctx)
			token := st.token(b, ctx, "caller")
			viaHTTP, card := httpClient(b, ctx, gw, "direct", token)
			requester := st.requesterAs(b, ctx, "mqttclient")
			viaMQTT := requester.Transport(ref("direct"))
			httpRaw := newRawHTTP(gw, "direct", token)
			mqttRaw := st.rawMQTTAs(b, "rawclient", "direct")
			// The floor: the same HTTP clients and call against a JSON-RPC endpoint that answers
			// at once with the agent's own reply (no gateway, no bus): the HTTP hop alone.
			canned, err := viaMQTT.SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "hello"))
			if err != nil {
				b.Fatal(err)
			}
			floorURL := floorServer(b, a2a.StreamResponse{Event: canned})
			viaFloor := floorClient(b, ctx, card, floorURL, token)
			floorRaw := newRawHTTP(gw, "direct", token)
			floorRaw.endpoint = floorURL + "/"
			// The hop taken apart (tcphop_test.go): no HTTP library on either side, then
			// net/http's server alone.
			cannedReply, err := json.Marshal(struct {
				JSONRPC string             `json:"jsonrpc"`
				ID      int                `json:"id"`
				Result  a2a.StreamResponse `json:"result"`
			}{"2.0", 1, a2a.StreamResponse{Event: canned}})
			if err != nil {
				b.Fatal(err)
			}
			tcpHop := newTCPClient(b, tcpFloor(b, append(cannedReply, '\n')), token)
			tcpNetHTTPHop := newTCPClient(b, floorURL+"/", token)
			// net/http with the SDK's decoder: the same client weight as the SDK's requester.
			httpSDKDecode := newRawHTTP(gw, "direct", token)
			httpSDKDecode.decode = a2amqtt.DecodeResponse
			govHTTP, _ := httpClient(b, ctx, gw, "memory", token)
			govMQTT := requester.Transport(ref("memory"))
			govSDKDecode := newRawHTTP(gw, "memory", token)
			govSDKDecode.decode = a2amqtt.DecodeResponse
			clients := []struct {
				name string
				send func(ctx context.Context) (any, error)
			}{
				{"mqtt", func(ctx context.Context) (any, error) {
					return viaMQTT.SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "hello"))
				}},
				{"http", func(ctx context.Context) (any, error) {
					return marks.timed(ctx, "", func(ctx context.Context) (any, error) {
						return viaHTTP.SendMessage(ctx, userMsg(uuid.NewString(), "", "hello"))
					})
				}},
				{"hop", func(ctx context.Context) (any, error) {
					return viaFloor.SendMessage(ctx, userMsg(uuid.NewString(), "", "hello"))
				}},
				{"raw-mqtt", func(ctx context.Context) (any, error) { return mqttRaw.send(ctx, "hello") }},
				{"raw-http", func(ctx context.Context) (any, error) {
					return marks.timed(ctx, "raw-", func(ctx context.Context) (any, error) { return httpRaw.send(ctx, "hello") })
				}},
				{"raw-hop", func(ctx context.Context) (any, error) { return floorRaw.send(ctx, "hello") }},
				{"tcp-hop", func(ctx context.Context) (any, error) { return tcpHop.send(ctx, "hello") }},
				{"tcp-nethttp-hop", func(ctx context.Context) (any, error) { return tcpNetHTTPHop.send(ctx, "hello") }},
				{"sdkdec-http", func(ctx context.Context) (any, error) {
					return marks.timed(ctx, "sdkdec-", func(ctx context.Context) (any, error) { return httpSDKDecode.send(ctx, "hello") })
				}},
				{"gov-mqtt", func(ctx context.Context) (any, error) {
					return govMQTT.SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "hello"))
				}},
				{"gov-http", func(ctx context.Context) (any, error) {
					return govHTTP.SendMessage(ctx, userMsg(uuid.NewString(), "", "hello"))
				}},
				{"gov-sdkdec-http", func(ctx context.Context) (any, error) { return govSDKDecode.send(ctx, "hello") }},
			}
			call := func(send func(context.Context) (any, error)) time.Duration {
				start := time.Now()
				res, err := send(ctx)
				d := time.Since(start)
				if task, ok := res.(*a2a.Task); err != nil || !ok || task.Status.State != a2a.TaskStateCompleted {
					b.Fatalf("call: %v %v", res, err)
				}
				return d
			}
			// Warm every path (the gateway's caller connection is made on first use).
			for range 5 {
				for _, c := range clients {
					call(c.send)
				}
			}
			marks.reset()
			httpRaw.chunked.Store(0)
			p50 := make([][]time.Duration, len(clients))
			b.ResetTimer()
			for range b.N {
				for i, c := range clients {
					p50[i] = append(p50[i], call(c.send))
				}
			}
			b.StopTimer()
			med := make(map[string]time.Duration, len(clients))
			for i, c := range clients {
				slices.Sort(p50[i])
				med[c.name] = p50[i][len(p50[i])/2]
				b.ReportMetric(float64(med[c.name].Microseconds()), c.name+"-p50-µs")
			}
			for _, prefix := range []string{"", "raw-"} {
				m, h, f := med[prefix+"mqtt"], med[prefix+"http"], med[prefix+"hop"]
				b.ReportMetric(float64(h)/float64(m), prefix+"http/mqtt")
				// The ratio a gateway that added nothing but the hop would reach.
				b.ReportMetric(float64(m+f)/float64(m), prefix+"hop-only-ratio")
			}
			// net/http with the SDK's decoder against the SDK's requester.
			b.ReportMetric(float64(med["sdkdec-http"])/float64(med["mqtt"]), "sdkdec-http/mqtt")
			// What net/http's server and its client each add to the hop (tcphop_test.go).
			b.ReportMetric(float64((med["tcp-nethttp-hop"] - med["tcp-hop"]).Microseconds()), "nethttp-server-µs")
			b.ReportMetric(float64((med["raw-hop"] - med["tcp-nethttp-hop"]).Microseconds()), "nethttp-client-µs")
			// The governed path (through the conversation service), a2a-go's client and net/http
			// with the SDK's decoder against the SDK's requester, and what the hop alone would make.
			gm := med["gov-mqtt"]
			b.ReportMetric(float64(med["gov-http"])/float64(gm), "gov-http/mqtt")
			b.ReportMetric(float64(med["gov-sdkdec-http"])/float64(gm), "gov-sdkdec-http/mqtt")
			b.ReportMetric(float64(gm+med["hop"])/float64(gm), "gov-hop-only-ratio")
			// Connections opened during the timed calls through the gateway (0: every call reused
			// a kept-alive one).
			b.ReportMetric(float64(marks.newConns.Load()), "http-new-conns")
			// Responses through the gateway without a Content-Length (chunked).
			b.ReportMetric(float64(httpRaw.chunked.Load())/float64(b.N), "raw-http-chunked")
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
// their ratio (docs/benchmarks.md). The same iterations stream to a raw paho client and an SSE
// reader on net/http that decode each event alike (rawclients_test.go), and to an SSE reader
// with the SDK's decoder, whose rate is read against the SDK's requester.
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
			requester := st.requesterAs(b, ctx, "mqttclient")
			viaMQTT := requester.Transport(ref("direct"))
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
			// The like-for-like pair (rawclients_test.go): an SSE reader on net/http and a raw paho
			// client, each event decoded by the same code.
			httpRaw := newRawHTTP(gw, "direct", st.token(b, ctx, "caller"))
			mqttRaw := st.rawMQTTAs(b, "rawclient", "direct")
			rawStream := func(stream func(context.Context, string) (int, error)) time.Duration {
				start := time.Now()
				n, err := stream(ctx, "go")
				if err != nil || n < events+2 {
					b.Fatalf("raw stream: %d events, want %d: %v", n, events+2, err)
				}
				return time.Since(start)
			}
			// An SSE reader with the SDK's decoder: the same client weight as the SDK's requester.
			httpSDKDecode := newRawHTTP(gw, "direct", st.token(b, ctx, "caller"))
			httpSDKDecode.decode = a2amqtt.DecodeResponse
			rawStream(mqttRaw.stream)
			rawStream(httpRaw.stream)
			rawStream(httpSDKDecode.stream)
			mqttRaw.firstEvent, httpRaw.firstEvent = nil, nil
			httpRaw.bodyReads.Store(0)
			var mq, ht, rm, rh, sh time.Duration
			b.ResetTimer()
			for range b.N {
				mq += stream(viaMQTT.SendStreamingMessage(ctx, nil, userMsg(uuid.NewString(), "", "go")))
				ht += stream(viaHTTP.SendStreamingMessage(ctx, userMsg(uuid.NewString(), "", "go")))
				rm += rawStream(mqttRaw.stream)
				rh += rawStream(httpRaw.stream)
				sh += rawStream(httpSDKDecode.stream)
			}
			b.StopTimer()
			perSecond := func(d time.Duration) float64 { return float64(events*b.N) / d.Seconds() }
			b.ReportMetric(perSecond(mq), "mqtt-events/s")
			b.ReportMetric(perSecond(ht), "http-events/s")
			b.ReportMetric(perSecond(ht)/perSecond(mq), "http/mqtt")
			b.ReportMetric(perSecond(rm), "raw-mqtt-events/s")
			b.ReportMetric(perSecond(rh), "raw-http-events/s")
			b.ReportMetric(perSecond(rh)/perSecond(rm), "raw-http/mqtt")
			b.ReportMetric(perSecond(sh), "sdkdec-http-events/s")
			b.ReportMetric(perSecond(sh)/perSecond(mq), "sdkdec-http/mqtt")
			// The first event's latency (the request included): a lone event is not held back.
			b.ReportMetric(median(mqttRaw.firstEvent).Seconds()*1e6, "raw-mqtt-first-event-µs")
			b.ReportMetric(median(httpRaw.firstEvent).Seconds()*1e6, "raw-http-first-event-µs")
			// Reads of the SSE body per event: how many events one write of the gateway carried.
			b.ReportMetric(float64(httpRaw.bodyReads.Load())/float64((events+2)*b.N), "raw-http-reads/event")
		})
	}
}

// floorServer is a JSON-RPC endpoint on loopback that reads each request's envelope and
// answers it with result, encoded once beforehand: an HTTP round trip with no gateway and no bus
// behind it. It returns the endpoint's URL.
func floorServer(b *testing.B, result a2a.StreamResponse) string {
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
	return srv.URL
}

// floorClient is a2a-go's HTTP client (as httpClient makes it, token included) for the
// floorServer at url.
func floorClient(b *testing.B, ctx context.Context, card *a2a.AgentCard, url, token string) *a2aclient.Client {
	b.Helper()
	floor := *card
	floor.SupportedInterfaces = []*a2a.AgentInterface{a2a.NewAgentInterface(url+"/", a2a.TransportProtocolJSONRPC)}
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
// response's first byte read, the client's call returned. It reports each step's median, per
// client (a metric name prefix).
type callMarks struct {
	entered, left atomic.Int64 // handler, ns since start
	newConns      atomic.Int64 // calls that did not reuse a kept-alive connection
	start         time.Time
	steps         map[string]*[5][]time.Duration
	order         []string
}

func newCallMarks() *callMarks { return &callMarks{steps: map[string]*[5][]time.Duration{}} }

func (m *callMarks) since() int64 { return int64(time.Since(m.start)) }

func (m *callMarks) reset() {
	m.newConns.Store(0)
	clear(m.steps)
	m.order = nil
}

func (m *callMarks) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.entered.Store(m.since())
		next.ServeHTTP(w, r)
		m.left.Store(m.since())
	})
}

// timed runs one call of the client named prefix and records its steps.
func (m *callMarks) timed(ctx context.Context, prefix string, send func(context.Context) (any, error)) (any, error) {
	m.start = time.Now()
	m.entered.Store(0)
	m.left.Store(0)
	var wrote, firstByte atomic.Int64
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote.Store(m.since()) },
		GotFirstResponseByte: func() { firstByte.Store(m.since()) },
		GotConn: func(info httptrace.GotConnInfo) {
			if !info.Reused {
				m.newConns.Add(1)
			}
		},
	})
	res, err := send(ctx)
	done := m.since()
	marks := []int64{0, wrote.Load(), m.entered.Load(), m.left.Load(), firstByte.Load(), done}
	steps := m.steps[prefix]
	if steps == nil {
		steps = &[5][]time.Duration{}
		m.steps[prefix] = steps
		m.order = append(m.order, prefix)
	}
	for i := range steps {
		steps[i] = append(steps[i], time.Duration(marks[i+1]-marks[i]))
	}
	return res, err
}

func (m *callMarks) report(b *testing.B) {
	names := [5]string{"encode+write", "to-handler", "handler", "to-client", "read+decode"}
	for _, prefix := range m.order {
		for i, ds := range m.steps[prefix] {
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2])/1e3, prefix+"step-"+names[i]+"-µs")
		}
	}
}

// median is the median of ds (which it sorts).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
