package gateway

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// holder answers every message with a working status, then holds the stream open until Release,
// then completes.
type holder struct {
	mu      sync.Mutex
	release chan struct{}
}

func newHolder() *holder { return &holder{release: make(chan struct{})} }

// Release completes the tasks held now; the next ones are held again.
func (h *holder) Release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.release)
	h.release = make(chan struct{})
}

func (h *holder) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		h.mu.Lock()
		release := h.release
		h.mu.Unlock()
		if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, nil), nil) {
			return
		}
		select {
		case <-release:
		case <-ctx.Done():
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
	}
}

func (*holder) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

// BenchmarkGatewaySSEMemory measures one gateway replica's memory with many SSE streams open at
// once (GATEWAY_STREAMS, default 1 000): the gateway runs in a child process (as cmd/gateway
// wires it), an SDK responder holds every stream open after its first event, and a2a-go's HTTP
// client opens them all, as one caller; it reports the child's RSS before, with every stream open,
// and its peak (VmHWM), and the RSS each stream adds (docs/benchmarks.md).
//
//	go test ./test/gateway -run '^$' -bench GatewaySSEMemory -benchtime 1x
func BenchmarkGatewaySSEMemory(b *testing.B) {
	streams := 1000
	if v := os.Getenv("GATEWAY_STREAMS"); v != "" {
		if _, err := fmt.Sscan(v, &streams); err != nil {
			b.Fatal(err)
		}
	}
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
			h := newHolder()
			resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{Executor: h, MaxConcurrent: streams + 100})
			if err != nil {
				b.Fatal(err)
			}
			defer resp.Close(context.Background())
			gw, pid := st.startChildGateway(b, ctx)
			client, _ := httpClient(b, ctx, gw, "direct", st.token(b, ctx, "caller"))
			// One call first: the caller's connection and the caches are made.
			if _, err := client.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(uuid.NewString())}); !errors.Is(err, a2a.ErrTaskNotFound) {
				b.Fatalf("warm-up GetTask: %v, want task not found", err)
			}
			idle := procMiB(b, pid, "VmRSS")
			b.ResetTimer()
			for range b.N {
				var opened, completed atomic.Int64
				var failed atomic.Value
				var wg sync.WaitGroup
				for range streams {
					wg.Add(1)
					go func() {
						defer wg.Done()
						first := true
						for ev, err := range client.SendStreamingMessage(ctx, userMsg(uuid.NewString(), "", "hold")) {
							if err != nil {
								failed.Store(err)
								return
							}
							if first {
								first = false
								opened.Add(1)
							}
							if su, ok := ev.(*a2a.TaskStatusUpdateEvent); ok && su.Status.State == a2a.TaskStateCompleted {
								completed.Add(1)
							}
						}
					}()
				}
				testenv.Eventually(b, 5*time.Minute, "every stream open", func() error {
					if err, _ := failed.Load().(error); err != nil {
						b.Fatalf("a stream failed: %v", err)
					}
					if n := opened.Load(); n < int64(streams) {
						return fmt.Errorf("%d of %d streams open", n, streams)
					}
					return nil
				})
				open := procMiB(b, pid, "VmRSS")
				b.StopTimer()
				h.Release()
				wg.Wait()
				if n := completed.Load(); n != int64(streams) {
					b.Fatalf("%d of %d streams completed (%v)", n, streams, failed.Load())
				}
				b.ReportMetric(idle, "idle-RSS-MiB")
				b.ReportMetric(open, "open-RSS-MiB")
				b.ReportMetric(procMiB(b, pid, "VmHWM"), "peak-RSS-MiB")
				b.ReportMetric((open-idle)*1024/float64(streams), "KiB/stream")
				b.ReportMetric(float64(streams), "streams")
				b.StartTimer()
			}
		})
	}
}
