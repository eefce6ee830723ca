package gateway

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
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
			gw, _ := st.gateway(b, ctx)
			viaHTTP, _ := httpClient(b, ctx, gw, "direct", st.token(b, ctx, "caller"))
			viaMQTT := st.requesterAs(b, ctx, "mqttclient").Transport(ref("direct"))
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
			}
			mq, ht := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				mq = append(mq, call(func() (a2a.SendMessageResult, error) {
					return viaMQTT.SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "hello"))
				}))
				ht = append(ht, call(func() (a2a.SendMessageResult, error) {
					return viaHTTP.SendMessage(ctx, userMsg(uuid.NewString(), "", "hello"))
				}))
			}
			b.StopTimer()
			slices.Sort(mq)
			slices.Sort(ht)
			p50m, p50h := mq[len(mq)/2], ht[len(ht)/2]
			b.ReportMetric(float64(p50m.Microseconds()), "mqtt-p50-µs")
			b.ReportMetric(float64(p50h.Microseconds()), "http-p50-µs")
			b.ReportMetric(float64(p50h)/float64(p50m), "http/mqtt")
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
