package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// BenchmarkProxyVsDirect measures request → final reply through the
// conversation service against the same plain-paho agent code reached
// directly, on the same Mosquitto broker in the same run: sequential
// latency (p50, p99) and throughput with 16 concurrent requesters. The
// service uses bbolt with fsync (the production single-replica store).
//
//	go test ./test/e2e/ -run '^$' -bench BenchmarkProxyVsDirect -benchtime 1x
func BenchmarkProxyVsDirect(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st := newStack(b, ctx, "mosquitto")
	// E2E_BENCH_NOSYNC=1 drops bbolt's fsync to show what the disk costs.
	st.startServiceWith(b, ctx, &clock{}, "bench", os.Getenv("E2E_BENCH_NOSYNC") == "1")
	startRawAgent(b, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))
	startRawAgent(b, ctx, st.addr, st.usernames["direct"], st.passwords["direct"], ref("direct"), ref("direct").RequestTopic())
	r := st.requester(b, ctx)
	const sequential, parallel, workers = 2000, 4000, 16
	type result struct {
		p50, p99 time.Duration
		rps      float64
	}
	run := func(tr *a2amqtt.Transport) result {
		c := uuid.NewString()
		lat := make([]time.Duration, 0, sequential)
		for i := range sequential {
			if i%100 == 0 {
				c = uuid.NewString()
			}
			start := time.Now()
			if _, err := send(ctx, tr, uuid.NewString(), c, "bench"); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		var wg sync.WaitGroup
		start := time.Now()
		for w := range workers {
			wg.Go(func() {
				c := uuid.NewString()
				for i := range parallel / workers {
					if i%100 == 0 {
						c = uuid.NewString()
					}
					if res, err := send(ctx, tr, uuid.NewString(), c, fmt.Sprintf("w%d", w)); err != nil || state(res) != a2a.TaskStateCompleted {
						b.Errorf("parallel request: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		return result{p50: lat[len(lat)/2], p99: lat[len(lat)*99/100], rps: float64(parallel) / time.Since(start).Seconds()}
	}
	b.ResetTimer()
	for range b.N {
		direct := run(r.Transport(ref("direct")))
		proxied := run(r.Transport(ref("raw")))
		b.ReportMetric(float64(direct.p50.Microseconds()), "direct-p50-µs")
		b.ReportMetric(float64(direct.p99.Microseconds()), "direct-p99-µs")
		b.ReportMetric(direct.rps, "direct-req/s")
		b.ReportMetric(float64(proxied.p50.Microseconds()), "proxy-p50-µs")
		b.ReportMetric(float64(proxied.p99.Microseconds()), "proxy-p99-µs")
		b.ReportMetric(proxied.rps, "proxy-req/s")
		b.ReportMetric(float64(proxied.p50)/float64(direct.p50), "p50-ratio")
		b.ReportMetric(float64(proxied.p99)/float64(direct.p99), "p99-ratio")
		b.ReportMetric(proxied.rps/direct.rps, "throughput-ratio")
	}
}
