// Command gateway joins A2A agents that speak HTTP to the MQTT fleet, both ways
// (internal/gateway, docs/gateway.md). It is stateless: run several replicas behind one Service.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func env(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

type options struct {
	listen, brokerURL, publicURL, namespace, audiences string
	syncInterval, idle                                 time.Duration
	maxBody                                            int64
}

func main() {
	var o options
	flag.StringVar(&o.listen, "listen", ":8080", "address of the A2A HTTP endpoints and /healthz")
	flag.StringVar(&o.brokerURL, "broker", env("A2A_BROKER", "mqtt://127.0.0.1:1883"), "MQTT v5 broker URL (env A2A_BROKER)")
	flag.StringVar(&o.publicURL, "public-url", env("A2A_GATEWAY_URL", ""), "the gateway's URL as HTTP callers reach it, for the cards (default: each request's Host)")
	flag.StringVar(&o.namespace, "namespace", env("A2A_WATCH_NAMESPACE", ""), "serve the Agents of this namespace only (default: all)")
	flag.StringVar(&o.audiences, "audiences", env("A2A_GATEWAY_AUDIENCES", ""), "comma-separated audiences a caller's token must be issued for (default: the API server's)")
	flag.DurationVar(&o.syncInterval, "sync-interval", 10*time.Second, "how often the HTTP agents held on the bus are re-read")
	flag.DurationVar(&o.idle, "idle-timeout", 10*time.Minute, "a caller identity's MQTT connection is closed after this long without a request")
	flag.Int64Var(&o.maxBody, "max-body-bytes", gateway.DefaultMaxBodyBytes, "largest request body accepted")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("gateway stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	reader, err := gateway.NewCachedReader(ctx, restCfg, o.namespace)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	dir := &gateway.Directory{Reader: reader, Namespace: o.namespace}
	conn := gateway.ConnConfig{BrokerURL: o.brokerURL, TLSFiles: a2amqtt.TLSFilesFromEnv(), Logger: log}
	pool := gateway.NewPool(conn, dir)
	defer pool.Close(context.Background())
	reviewer := &gateway.TokenReviewer{Reviews: kube.AuthenticationV1().TokenReviews()}
	if o.audiences != "" {
		reviewer.Audiences = strings.Split(o.audiences, ",")
	}
	in := gateway.NewInbound(gateway.InboundConfig{Directory: dir, Auth: reviewer, Pool: pool,
		BrokerURL: o.brokerURL, PublicURL: o.publicURL, MaxBodyBytes: o.maxBody, Logger: log})
	out := gateway.NewOutbound(gateway.OutboundConfig{Conn: conn, Directory: dir})
	go out.Run(ctx, o.syncInterval)
	go func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				pool.Sweep(ctx, o.idle)
			}
		}
	}()
	srv := &http.Server{Addr: o.listen, Handler: in, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("gateway listening", "addr", o.listen, "broker", o.brokerURL)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
