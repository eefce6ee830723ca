package gateway

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
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
