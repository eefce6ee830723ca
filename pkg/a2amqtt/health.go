package a2amqtt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// DefaultHealthGrace is how long an agent process may be disconnected from the broker before
// /readyz fails: longer than a broker restart's reconnect, short enough that Kubernetes stops
// routing to (and reports) an agent that really lost the bus.
const DefaultHealthGrace = 15 * time.Second

// HealthHandler serves the probes of an agent process built on conn:
//
//   - /readyz fails (503) while the MQTT connection has been down longer than grace (or was
//     never established, or is closed), with the reason and the last connect error in the body
//     (Conn.Healthy).
//   - /healthz fails (503) only when the client is wedged and a restart is the cure: the
//     connection manager stopped although nobody closed it, or a message handler has blocked
//     the receive goroutine for longer than max(4×grace, 1 minute) (Conn.Alive). A broker that is
//     down does not fail liveness: restarting the agent would not bring it back.
//
// grace <= 0 means DefaultHealthGrace.
func HealthHandler(conn *Conn, grace time.Duration) http.Handler {
	if grace <= 0 {
		grace = DefaultHealthGrace
	}
	stuck := max(4*grace, time.Minute)
	mux := http.NewServeMux()
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "%s: %v\n", conn.Agent(), err)
				return
			}
			fmt.Fprintln(w, "ok")
		}
	}
	mux.Handle("/readyz", probe(func() error { return conn.Healthy(grace) }))
	mux.Handle("/healthz", probe(func() error { return conn.Alive(stuck) }))
	return mux
}

// ServeHealth serves HealthHandler on addr (e.g. ":8081") until ctx ends. It returns the bound
// address once the listener is up, so a port conflict is reported at start; serving errors
// after that are logged on conn's logger.
func ServeHealth(ctx context.Context, addr string, conn *Conn, grace time.Duration) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: health endpoint %s: %w", addr, err)
	}
	srv := &http.Server{Handler: HealthHandler(conn, grace), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			conn.Logger().Error("health endpoint stopped", "addr", addr, "err", err)
		}
	}()
	return ln.Addr(), nil
}
