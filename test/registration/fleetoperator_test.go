package registration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// The embedded fleet benchmark runs the operator in a process of its own, as it runs in a
// cluster: the controllers, the broker runtime and the embedded broker (which lives in the
// operator's process, as in `make dev`) in a child process, the test binary started again with
// fleetOperatorEnv. Its peak RSS and CPU are then the operator's, apart from the benchmark's
// creators, Ready tracker and witness clients. FLEET_OPERATOR_IN_PROCESS=1 runs it in the test
// process instead (the Mosquitto benchmark always does: its broker is a process already).

// fleetOperatorEnv holds the child's configuration (JSON) and makes TestMain run it.
const fleetOperatorEnv = "A2A_FLEET_BENCH_OPERATOR"

// fleetOperator is the operator under test, wherever it runs.
type fleetOperator interface {
	// snapshot is what the operator has counted so far; observe adds the broker's clients and
	// ACL entries (a full Observe).
	snapshot(observe bool) (operatorSnapshot, error)
	pid() int
	// peakRSSMiB is the operator process's high-water resident set (since resetPeakRSS for this
	// process).
	peakRSSMiB() float64
	writeHeapProfile(path string) error
	// cpuProfile starts the operator process's CPU profile into path, or stops it ("").
	cpuProfile(path string) error
}

// operatorSnapshot is the operator side's counters at one moment.
type operatorSnapshot struct {
	Stats       acl.Stats
	Kicks       int64 // the broker's count of live connections kicked other than the commanded one
	Writes      map[string]int
	Reads       map[string]int
	API         map[string]apiTiming // the operator's requests (no watches) and their time, by kind
	Controllers map[string]controllerStats
	HeapInuse   uint64
	Clients     int
	ACLEntries  int
}

// operatorCounters are the operator side's instruments, wherever it runs.
type operatorCounters struct {
	backend acl.Backend
	others  *collateralCounter
	writes  *writeCounter
}

func (c operatorCounters) snapshot(observe bool) (operatorSnapshot, error) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := operatorSnapshot{Stats: c.backend.Stats(), Kicks: c.others.n.Load(), Writes: c.writes.snapshot(),
		Reads: c.writes.snapshotReads(), API: c.writes.snapshotTimed(), Controllers: controllerMetrics(), HeapInuse: ms.HeapInuse}
	if observe {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		st, err := c.backend.Observe(ctx, nil)
		if err != nil {
			return s, fmt.Errorf("observe: %w", err)
		}
		s.Clients = len(st.Clients)
		for _, r := range st.Roles {
			s.ACLEntries += len(r.ACLs)
		}
	}
	return s, nil
}

// inProcessOperator runs in the test process.
type inProcessOperator struct{ operatorCounters }

func (inProcessOperator) pid() int                           { return os.Getpid() }
func (inProcessOperator) peakRSSMiB() float64                { return peakRSSMiB(os.Getpid()) }
func (inProcessOperator) writeHeapProfile(path string) error { return writeHeapProfileTo(path) }

// cpuProfile is a no-op in the test process: its own -cpuprofile covers it.
func (inProcessOperator) cpuProfile(string) error { return nil }

// fleetOperatorConfig is the child's configuration.
type fleetOperatorConfig struct {
	Host                      string
	CAData, CertData, KeyData []byte
	ServerName                string
	Namespaces                map[string]string
	MaxConcurrent             int
	// CardSigning signs every card with a key generated into org0's namespace.
	CardSigning bool
}

// childOperator is the operator in a child process.
type childOperator struct {
	cmd                   *exec.Cmd
	base                  string // its control endpoint, http://host:port
	brokerURL, brokerAddr string
}

// startChildOperator starts the operator process for namespaces; it is killed when b ends.
func startChildOperator(b *testing.B, ctx context.Context, cfg *rest.Config, namespaces map[string]string, maxConcurrent int, cardSigning bool) *childOperator {
	b.Helper()
	tls := rest.CopyConfig(cfg)
	if err := rest.LoadTLSFiles(tls); err != nil {
		b.Fatalf("operator process: %v", err)
	}
	conf, err := json.Marshal(fleetOperatorConfig{Host: cfg.Host, CAData: tls.CAData, CertData: tls.CertData, KeyData: tls.KeyData,
		ServerName: tls.ServerName, Namespaces: namespaces, MaxConcurrent: maxConcurrent, CardSigning: cardSigning})
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fleetOperatorEnv+"="+string(conf))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdin, err := cmd.StdinPipe() // the child exits when it closes
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start operator process: %v", err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	// The child's first line: its control endpoint and its broker.
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line, ok := <-lines:
		f := strings.Fields(line)
		if !ok || len(f) != 4 || f[0] != "ready" {
			b.Fatalf("operator process did not start: %q", line)
		}
		return &childOperator{cmd: cmd, base: "http://" + f[1], brokerURL: f[2], brokerAddr: f[3]}
	case <-time.After(2 * time.Minute):
		b.Fatal("operator process: no ready line in 2 minutes")
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	return nil
}

func (c *childOperator) pid() int            { return c.cmd.Process.Pid }
func (c *childOperator) peakRSSMiB() float64 { return peakRSSMiB(c.cmd.Process.Pid) }

func (c *childOperator) snapshot(observe bool) (operatorSnapshot, error) {
	var s operatorSnapshot
	resp, err := http.Get(c.base + "/snapshot?observe=" + strconv.FormatBool(observe))
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return s, fmt.Errorf("operator process: %s: %s", resp.Status, msg)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// cpuProfile starts (path != "") or stops the operator process's CPU profile.
func (c *childOperator) cpuProfile(path string) error {
	url := c.base + "/cpuprofile/stop"
	if path != "" {
		url = c.base + "/cpuprofile/start?path=" + path
	}
	resp, err := http.Post(url, "text/plain", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("operator process CPU profile: %s: %s", resp.Status, msg)
	}
	return nil
}

func (c *childOperator) writeHeapProfile(path string) error {
	resp, err := http.Post(c.base+"/heapprofile?path="+path, "text/plain", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("operator process heap profile: %s: %s", resp.Status, msg)
	}
	return nil
}

// runFleetOperator is the child: the operator with the embedded broker, for the namespaces of
// conf, serving its counters on a loopback port until its standard input closes.
func runFleetOperator(conf string) error {
	var c fleetOperatorConfig
	if err := json.Unmarshal([]byte(conf), &c); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cfg := &rest.Config{Host: c.Host, TLSClientConfig: rest.TLSClientConfig{CAData: c.CAData, CertData: c.CertData,
		KeyData: c.KeyData, ServerName: c.ServerName}}
	writes := operatorClientConfig(cfg)
	scheme := testenv.NewScheme()
	k, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	var others collateralCounter
	srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0", Store: embedded.StoreConfig{OnKick: others.observe}})
	if err != nil {
		return fmt.Errorf("start embedded broker: %w", err)
	}
	defer srv.Close()
	cp := &testenv.ControlPlane{Config: cfg, Client: k, Scheme: scheme}
	bc := registration.BrokerConfig{URL: srv.URL(), Backend: srv.Backend()}
	if c.CardSigning {
		bc.CardSigning = &registration.CardSigning{Secret: client.ObjectKey{Namespace: c.Namespaces["org0"], Name: "card-signing-keys"}, Generate: true, Reader: k}
	}
	_, stop, err := cp.RunOperator(context.Background(), testenv.Operator{Config: cfg, Namespaces: c.Namespaces,
		Broker:      bc,
		Controllers: controllers.Options{MaxConcurrentReconciles: c.MaxConcurrent}})
	if err != nil {
		return err
	}
	counters := operatorCounters{backend: srv.Backend(), others: &others, writes: writes}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /snapshot", func(w http.ResponseWriter, r *http.Request) {
		s, err := counters.snapshot(r.URL.Query().Get("observe") == "true")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(s)
	})
	var cpuProfile *os.File
	mux.HandleFunc("POST /cpuprofile/start", func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Create(r.URL.Query().Get("path"))
		if err == nil {
			if err = pprof.StartCPUProfile(f); err != nil {
				_ = f.Close()
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		cpuProfile = f
	})
	mux.HandleFunc("POST /cpuprofile/stop", func(w http.ResponseWriter, r *http.Request) {
		if cpuProfile != nil {
			pprof.StopCPUProfile()
			_ = cpuProfile.Close()
			cpuProfile = nil
		}
	})
	mux.HandleFunc("POST /heapprofile", func(w http.ResponseWriter, r *http.Request) {
		if err := writeHeapProfileTo(r.URL.Query().Get("path")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(l) }()
	fmt.Printf("ready %s %s %s\n", l.Addr(), srv.URL(), srv.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the benchmark closes it (or dies)
	_ = hs.Close()
	return stop()
}

// collateralCounter sums the live connections the broker kicked other than the commanded one.
type collateralCounter struct{ n atomic.Int64 }

func (c *collateralCounter) observe(k acl.Kick) { c.n.Add(int64(len(k.Others(k.Command.Username)))) }
