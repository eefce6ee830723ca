// Command chaosagent is the agent of the chaos suite: an SDK responder (pkg/a2amqtt, a2a-go's
// default handler) that answers "echo:X" with X, "work:D:X" with X after working for the
// duration D, and "ask:X" with an input-required question whose answer Y completes the task with
// "X+Y". Every execution is appended to a journal file (one write per line, so a kill -9 loses
// nothing already recorded): the suite counts duplicated executions from it. Configured like the
// example agents, by the variables the operator gives a workload (A2A_*), A2A_SESSION_EXPIRY (a
// persistent session), A2A_CONNECT_TIMEOUT (how long the first connection may fail: a new pod of
// a staged credential rotation waits for the broker to get its password), and:
//
//   - CHAOS_DIR, POD_NAME: the folder (a volume that outlives the pod: every pod of the workload
//     mounts the same claim) where the pod writes POD_NAME.journal and POD_NAME.log (its log,
//     also on stderr), so the executions and logs of pods a rollout deleted stay readable;
//   - --health-addr: the SDK's /readyz and /healthz, and /journal (every pod's journal in the
//     folder, each line prefixed with its pod's name) and /log?pod=NAME, which the suite reads
//     through the API server's pod proxy (the host cannot reach pod addresses).
//
// On SIGTERM it drains like any well-behaved agent: it stops taking requests, finishes the ones
// in flight, publishes their replies and disconnects, within the pod's termination grace period.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

type executor struct {
	mu      sync.Mutex
	journal *os.File
	// executing counts executions in progress (logged when a drain starts).
	executing atomic.Int64
}

func (e *executor) record(ec *a2asrv.ExecutorContext, text string) {
	msgID := ""
	if ec.Message != nil {
		msgID = ec.Message.ID
	}
	line := fmt.Sprintf("%s %s %s %q\n", time.Now().UTC().Format(time.RFC3339Nano), ec.TaskID, msgID, text)
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.journal.WriteString(line)
}

func reply(ec *a2asrv.ExecutorContext, text string) *a2a.Message {
	return a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart(text))
}

// Execute implements a2asrv.AgentExecutor.
func (e *executor) Execute(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		e.executing.Add(1)
		defer e.executing.Add(-1)
		text := a2amqtt.TextOf(ec.Message)
		e.record(ec, text)
		if task := ec.StoredTask; task != nil && task.Status.State == a2a.TaskStateInputRequired && len(task.History) > 0 {
			first := strings.TrimPrefix(a2amqtt.TextOf(task.History[0]), "ask:")
			answer := first + "+" + text
			if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(answer)), nil) {
				return
			}
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, reply(ec, answer)), nil)
			return
		}
		if strings.HasPrefix(text, "ask:") {
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, reply(ec, "and then?")), nil)
			return
		}
		out := strings.TrimPrefix(text, "echo:")
		if rest, ok := strings.CutPrefix(text, "work:"); ok {
			d, x, _ := strings.Cut(rest, ":")
			work, err := time.ParseDuration(d)
			if err != nil {
				yield(nil, fmt.Errorf("work: %w", err))
				return
			}
			// The work runs to its end even when the process is asked to stop: the drain waits.
			time.Sleep(work)
			out = x
		}
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(out)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, reply(ec, out)), nil)
	}
}

// Cancel implements a2asrv.AgentExecutor.
func (e *executor) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

func main() {
	dir, pod := os.Getenv("CHAOS_DIR"), os.Getenv("POD_NAME")
	var logOut io.Writer = os.Stderr
	if dir != "" && pod != "" {
		f, err := os.OpenFile(filepath.Join(dir, pod+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos agent: log file:", err)
			os.Exit(1)
		}
		defer f.Close()
		logOut = io.MultiWriter(os.Stderr, f)
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := run(log, dir, pod); err != nil {
		log.Error("chaos agent stopped", "err", err)
		os.Exit(1)
	}
}

// journalHandler serves the files of the chaos folder: /journal is every pod's journal, each
// line prefixed with the pod's name; /log?pod=NAME is one pod's log.
func journalHandler(dir string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/journal", func(w http.ResponseWriter, _ *http.Request) {
		files, err := filepath.Glob(filepath.Join(dir, "*.journal"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		sort.Strings(files)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			pod := strings.TrimSuffix(filepath.Base(file), ".journal")
			for line := range strings.Lines(string(data)) {
				fmt.Fprintf(w, "%s %s", pod, line)
			}
		}
	})
	mux.HandleFunc("/log", func(w http.ResponseWriter, r *http.Request) {
		pod := r.URL.Query().Get("pod")
		if pod == "" || strings.ContainsAny(pod, "/.") {
			http.Error(w, "want ?pod=NAME", http.StatusBadRequest)
			return
		}
		data, err := os.ReadFile(filepath.Join(dir, pod+".log"))
		if errors.Is(err, os.ErrNotExist) {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		} else if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(data)
	})
	return mux
}

// durationEnv reads a duration variable (0 when unset).
func durationEnv(key string) (time.Duration, error) {
	v := os.Getenv(key)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", key, v, err)
	}
	return d, nil
}

// drainTimeout bounds the drain on SIGTERM, well within the default termination grace period
// (30 s).
const drainTimeout = 10 * time.Second

func run(log *slog.Logger, dir, pod string) error {
	healthAddr := flag.String("health-addr", "", "serve /readyz and /healthz here (a2amqtt.ServeHealth)")
	flag.Parse()
	ref := a2amqtt.AgentRef{Org: os.Getenv("A2A_ORG"), Unit: os.Getenv("A2A_UNIT"), Agent: os.Getenv("A2A_AGENT")}
	if err := ref.Validate(); err != nil {
		return err
	}
	sessionExpiry, err := durationEnv("A2A_SESSION_EXPIRY")
	if err != nil {
		return err
	}
	connectTimeout, err := durationEnv("A2A_CONNECT_TIMEOUT")
	if err != nil {
		return err
	}
	if dir == "" || pod == "" {
		return errors.New("CHAOS_DIR and POD_NAME must be set")
	}
	journal, err := os.OpenFile(filepath.Join(dir, pod+".journal"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer journal.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	broker := os.Getenv("A2A_BROKER")
	cfg := a2amqtt.Config{
		BrokerURL: broker, Username: os.Getenv("A2A_USERNAME"), Password: os.Getenv("A2A_PASSWORD"), Agent: ref,
		Card: &a2a.AgentCard{Name: ref.Agent, Description: "chaos suite agent", Version: "0.1.0",
			SupportedInterfaces: []*a2a.AgentInterface{a2amqtt.AgentInterface(broker, ref)},
			DefaultInputModes:   []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"}},
		SessionExpiry: sessionExpiry,
		Logger:        log,
	}
	// The first connection may take up to connectTimeout, tried again with the SDK's own
	// ConnectTimeout per attempt: that one also bounds each later reconnect's dial, and a dial to
	// the address of a broker pod that just went (a stale Service endpoint) hangs until it
	// expires (measured on kind: a 1-minute ConnectTimeout kept the agents away for 60 s).
	deadline := time.Now().Add(connectTimeout)
	var conn *a2amqtt.Conn
	for {
		if conn, err = a2amqtt.Connect(ctx, cfg); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		log.Warn("chaos agent: first connection failed; trying again", "err", err)
		time.Sleep(time.Second)
	}
	exec := &executor{journal: journal}
	resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{Executor: exec, RequestTopic: os.Getenv("A2A_REQUEST_TOPIC")})
	if err != nil {
		_ = conn.Close(context.Background())
		return err
	}
	if *healthAddr != "" {
		// Served until the process exits (not only until SIGTERM): the suite reads the journal
		// of a draining pod too.
		ln, err := net.Listen("tcp", *healthAddr)
		if err != nil {
			_ = conn.Close(context.Background())
			return fmt.Errorf("health endpoint: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/readyz", a2amqtt.HealthHandler(conn, 0))
		mux.Handle("/healthz", a2amqtt.HealthHandler(conn, 0))
		files := journalHandler(dir)
		mux.Handle("/journal", files)
		mux.Handle("/log", files)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("health endpoint stopped", "err", err)
			}
		}()
	}
	log.Info("chaos agent serving", "agent", ref.String(), "topic", os.Getenv("A2A_REQUEST_TOPIC"), "session_expiry", sessionExpiry)
	<-ctx.Done()
	start := time.Now()
	log.Info("chaos agent draining: no new requests, finishing the ones in flight", "executing", exec.executing.Load())
	cctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	rerr := resp.Close(cctx)
	cerr := conn.Close(cctx)
	if rerr != nil || cerr != nil {
		return fmt.Errorf("drain: responder: %v, connection: %v", rerr, cerr)
	}
	log.Info("chaos agent stopped cleanly", "drained_in", time.Since(start).Round(time.Millisecond).String())
	return nil
}
