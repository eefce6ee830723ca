package a2amqtt

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// Benchmarks run over a loopback Mosquitto (hack/install-mosquitto.sh):
//
//	go test -run '^$' -bench . -benchtime 2000x ./pkg/a2amqtt/
//
// Each benchmark measures the SDK path and a raw paho baseline in the same
// run, interleaved, so background load affects both alike. Results and
// targets: docs/benchmarks.md.

// rawClient is a bare paho v5 client (no autopaho, no SDK).
func rawClient(b *testing.B, addr, id string, onMsg func(*paho.Publish)) *paho.Client {
	b.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			if onMsg != nil {
				onMsg(pr.Packet)
			}
			return true, nil
		},
	}})
	if _, err := c.Connect(context.Background(), &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c
}

func subscribeRaw(b *testing.B, c *paho.Client, topic string) {
	b.Helper()
	if _, err := c.Subscribe(context.Background(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}}); err != nil {
		b.Fatal(err)
	}
}

// rawRoundTrip is the baseline: request QoS1 to a topic, an echo client
// answers QoS1 on the response topic with the same correlation data.
type rawRoundTrip struct {
	req   *paho.Client
	reply chan struct{}
}

func newRawRoundTrip(b *testing.B, addr string) *rawRoundTrip {
	rt := &rawRoundTrip{reply: make(chan struct{}, 1)}
	var echo *paho.Client
	echo = rawClient(b, addr, "bench/raw/echo", func(p *paho.Publish) {
		go func() {
			_, _ = echo.Publish(context.Background(), &paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: p.Payload,
				Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData}})
		}()
	})
	subscribeRaw(b, echo, "bench/raw/request")
	rt.req = rawClient(b, addr, "bench/raw/req", func(*paho.Publish) { rt.reply <- struct{}{} })
	subscribeRaw(b, rt.req, "bench/raw/reply")
	return rt
}

func (rt *rawRoundTrip) do(payload []byte) error {
	if _, err := rt.req.Publish(context.Background(), &paho.Publish{Topic: "bench/raw/request", QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{ResponseTopic: "bench/raw/reply", CorrelationData: []byte("c")}}); err != nil {
		return err
	}
	select {
	case <-rt.reply:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("raw round trip timed out")
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(p * float64(len(s)-1))
	return s[i]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func benchAddr(b *testing.B) (brokertest.Broker, string) {
	m := brokertest.StartMosquitto(b, brokertest.MosquittoOptions{})
	u, _ := url.Parse(m.URL())
	return m, u.Host
}

// BenchmarkSendMessage: one SDK SendMessage round trip (requester →
// responder with a2a-go handler → reply) vs one raw QoS1 request/reply,
// interleaved per iteration.
func BenchmarkSendMessage(b *testing.B) {
	b.Run("default-direct-handler", func(b *testing.B) { benchSendMessage(b, true) })
	b.Run("a2a-go-reference-handler", func(b *testing.B) { benchSendMessage(b, false) })
}

func benchSendMessage(b *testing.B, direct bool) {
	m, addr := benchAddr(b)
	exec := &scriptExec{fn: func(_ context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("ok"))), nil)
	}}
	serveT(b, m, agentB, exec, func(o *ResponderOptions) { o.ReferenceHandler = !direct })
	req := requesterT(b, m, agentA, func(o *RequesterOptions) { o.Retry = RetryPolicy{FirstReplyTimeout: 5 * time.Second} })
	tr := req.Transport(agentB)
	raw := newRawRoundTrip(b, addr)
	ctx := context.Background()
	// A request payload of the same size as the SDK's, for a fair baseline.
	sample, _ := prepareSend(userText("ping"))
	payload := []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":"%s","method":"SendMessage","params":%s}`, "00000000-0000-4000-8000-000000000000", mustJSON(sample)))

	for i := 0; i < 50; i++ { // warm up connections, caches, JIT-free but GC-stable
		if _, err := tr.SendMessage(ctx, nil, userText("ping")); err != nil {
			b.Fatal(err)
		}
		if err := raw.do(payload); err != nil {
			b.Fatal(err)
		}
	}
	sdk := make([]time.Duration, 0, b.N)
	rawD := make([]time.Duration, 0, b.N)
	var rawCPU, sdkCPU time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c0, t0 := processCPU(), time.Now()
		if err := raw.do(payload); err != nil {
			b.Fatal(err)
		}
		c1, t1 := processCPU(), time.Now()
		if _, err := tr.SendMessage(ctx, nil, userText("ping")); err != nil {
			b.Fatal(err)
		}
		c2, t2 := processCPU(), time.Now()
		rawD = append(rawD, t1.Sub(t0))
		sdk = append(sdk, t2.Sub(t1))
		rawCPU += c1 - c0
		sdkCPU += c2 - c1
	}
	b.StopTimer()
	// CPU of this process (both clients of each path; the broker is another process) per
	// round trip, approximate: work a path leaves behind (a late PUBACK) lands in the next.
	b.ReportMetric(us(rawCPU/time.Duration(b.N)), "raw-cpu-µs")
	b.ReportMetric(us(sdkCPU/time.Duration(b.N)), "sdk-cpu-µs")
	rp50, rp99 := percentile(rawD, 0.50), percentile(rawD, 0.99)
	sp50, sp99 := percentile(sdk, 0.50), percentile(sdk, 0.99)
	b.ReportMetric(us(rp50), "raw-p50-µs")
	b.ReportMetric(us(rp99), "raw-p99-µs")
	b.ReportMetric(us(sp50), "sdk-p50-µs")
	b.ReportMetric(us(sp99), "sdk-p99-µs")
	b.ReportMetric(float64(sp50)/float64(rp50), "p50-ratio")
	b.ReportMetric(float64(sp99)/float64(rp99), "p99-ratio")
	reportLoad(b)
}

// processCPU is the user+system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportLoad records the 1-minute load average beside the ratios: on a shared machine it says
// how much the absolute figures (not the interleaved ratios) are worth.
func reportLoad(b *testing.B) {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	var load float64
	if _, err := fmt.Sscan(string(raw), &load); err == nil {
		b.ReportMetric(load, "loadavg-1m")
	}
}

// BenchmarkStreamingThroughput: stream items per second through the SDK
// (one SendStreamingMessage whose executor emits n artifact updates) vs raw
// QoS1 publishes of the same payload size from one client to a subscriber.
func BenchmarkStreamingThroughput(b *testing.B) {
	b.Run("default-direct-handler", func(b *testing.B) { benchStreaming(b, true) })
	b.Run("a2a-go-reference-handler", func(b *testing.B) { benchStreaming(b, false) })
}

func benchStreaming(b *testing.B, direct bool) {
	const n = 200
	m, addr := benchAddr(b)
	chunk := a2a.NewTextPart(string(make([]byte, 64)))
	exec := &scriptExec{fn: func(_ context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		art := a2a.NewArtifactEvent(ec, chunk)
		for i := 0; i < n; i++ {
			ev := a2a.NewArtifactUpdateEvent(ec, art.Artifact.ID, chunk)
			ev.Append = i > 0
			if !yield(ev, nil) {
				return
			}
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
	}}
	serveT(b, m, agentB, exec, func(o *ResponderOptions) { o.ReferenceHandler = !direct })
	req := requesterT(b, m, agentA, func(o *RequesterOptions) { o.Retry = RetryPolicy{FirstReplyTimeout: 10 * time.Second} })
	tr := req.Transport(agentB)

	got := make(chan struct{}, n)
	sub := rawClient(b, addr, "bench/raw/sub", func(*paho.Publish) { got <- struct{}{} })
	subscribeRaw(b, sub, "bench/raw/stream")
	pub := rawClient(b, addr, "bench/raw/pub", nil)
	// Same size as one SDK artifact update on the wire.
	item := []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":"00000000-0000-4000-8000-000000000000","result":{"artifactUpdate":{"append":true,"artifact":{"artifactId":"00000000-0000-4000-8000-000000000000","parts":[{"text":"%s"}]},"contextId":"00000000-0000-4000-8000-000000000000","taskId":"00000000-0000-4000-8000-000000000000"}}}`, string(make([]byte, 64))))

	ctx := context.Background()
	var sdkTime, rawTime time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		for j := 0; j < n; j++ {
			if _, err := pub.Publish(ctx, &paho.Publish{Topic: "bench/raw/stream", QoS: 1, Payload: item}); err != nil {
				b.Fatal(err)
			}
		}
		for j := 0; j < n; j++ {
			select {
			case <-got:
			case <-time.After(5 * time.Second):
				b.Fatal("raw stream stalled")
			}
		}
		t1 := time.Now()
		count := 0
		for _, err := range tr.SendStreamingMessage(ctx, nil, userText("stream")) {
			if err != nil {
				b.Fatal(err)
			}
			count++
		}
		t2 := time.Now()
		if count != n+1 {
			b.Fatalf("got %d stream items, want %d", count, n+1)
		}
		rawTime += t1.Sub(t0)
		sdkTime += t2.Sub(t1)
	}
	b.StopTimer()
	rawRate := float64(n*b.N) / rawTime.Seconds()
	sdkRate := float64(n*b.N) / sdkTime.Seconds()
	b.ReportMetric(rawRate, "raw-msgs/s")
	b.ReportMetric(sdkRate, "sdk-items/s")
	b.ReportMetric(sdkRate/rawRate, "throughput-ratio")
	reportLoad(b)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
