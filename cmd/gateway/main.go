// Command gateway joins A2A agents that speak HTTP to the MQTT fleet, both ways
// (internal/gateway, docs/gateway.md). It keeps no task state; several replicas behind one
// Service share the identities through a ring of Leases (--replica-id, --ring-namespace), so that
// each identity's one MQTT client ID is used by one replica.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	// The ring of replicas (internal/gateway/ring.go): on when replicaID and ringNamespace are set.
	replicaID, ringNamespace, ringName, advertise string
	ringTTL                                       time.Duration
	// cardStatus writes the CardMatches condition of the HTTP agents held.
	cardStatus bool
	// cardKeysAgent is NAMESPACE/NAME of the Agent whose identity reads the card signing keys.
	cardKeysAgent string
	// cardSigningDir holds the gateway's own keys that sign the cards it serves.
	cardSigningDir string
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
	flag.StringVar(&o.replicaID, "replica-id", env("POD_NAME", ""), "this replica's name in the ring of replicas (env POD_NAME); with --ring-namespace, several replicas share the identities")
	flag.StringVar(&o.ringNamespace, "ring-namespace", env("POD_NAMESPACE", ""), "namespace of the replicas' Leases (env POD_NAMESPACE); empty: one replica serves every identity")
	flag.StringVar(&o.ringName, "ring-name", "a2a-gateway", "name of the ring (its Leases' label and name prefix)")
	flag.StringVar(&o.advertise, "advertise-url", advertiseDefault(), "this replica's URL as the other replicas reach it (default http://$POD_IP:8080)")
	flag.StringVar(&o.cardKeysAgent, "card-keys-agent", env("A2A_GATEWAY_CARD_KEYS_AGENT", ""), "NAMESPACE/NAME of an Agent (without a workload) whose identity reads the card signing keys on the bus, served at /.well-known/jwks.json (empty: not served)")
	flag.StringVar(&o.cardSigningDir, "card-signing-dir", env("A2A_GATEWAY_CARD_SIGNING_DIR", ""), "folder (a mounted Secret) of the gateway's own PEM private keys (tls.key or *.pem; ECDSA P-256 or Ed25519) that sign every card it serves, listed at /.well-known/jwks.json beside the bus's keys (empty: served cards are unsigned)")
	flag.BoolVar(&o.cardStatus, "card-status", true, "compare the card each HTTP agent serves with its spec.card at every sync and set the Agent's CardMatches condition (needs patch on agents/status)")
	flag.DurationVar(&o.ringTTL, "ring-ttl", 10*time.Second, "a replica that stopped renewing its Lease leaves the ring after this long")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("gateway stopped", "err", err)
		os.Exit(1)
	}
}

// advertiseDefault is http://$POD_IP:8080 when the downward API gives the pod's IP.
func advertiseDefault() string {
	if ip := os.Getenv("POD_IP"); ip != "" {
		return "http://" + net.JoinHostPort(ip, "8080")
	}
	return ""
}

// startRing joins the ring of replicas when configured (nil otherwise): on each change the pool
// lets the callers that moved go and the HTTP agents are synced at once.
func startRing(ctx context.Context, o options, restCfg *rest.Config, log *slog.Logger) (*gateway.Ring, error) {
	if o.replicaID == "" || o.ringNamespace == "" {
		return nil, nil
	}
	if o.advertise == "" {
		return nil, errors.New("--advertise-url (or POD_IP) is needed with a ring of replicas")
	}
	c, err := client.New(restCfg, client.Options{Scheme: gateway.NewScheme()})
	if err != nil {
		return nil, fmt.Errorf("lease client: %w", err)
	}
	return gateway.NewRing(gateway.RingConfig{Client: c, Namespace: o.ringNamespace, Name: o.ringName,
		ReplicaID: o.replicaID, Address: o.advertise, TTL: o.ringTTL, Logger: log}), nil
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
	ring, err := startRing(ctx, o, restCfg, log)
	if err != nil {
		return err
	}
	conn := gateway.ConnConfig{BrokerURL: o.brokerURL, TLSFiles: a2amqtt.TLSFilesFromEnv(), Logger: log}
	pool := gateway.NewPool(conn, dir)
	defer pool.Close(context.Background())
	reviewer := &gateway.TokenReviewer{Reviews: kube.AuthenticationV1().TokenReviews()}
	if o.audiences != "" {
		reviewer.Audiences = strings.Split(o.audiences, ",")
	}
	var keysAgent client.ObjectKey
	if o.cardKeysAgent != "" {
		ns, name, ok := strings.Cut(o.cardKeysAgent, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("--card-keys-agent %q: want NAMESPACE/NAME", o.cardKeysAgent)
		}
		keysAgent = client.ObjectKey{Namespace: ns, Name: name}
	}
	var signer *gateway.CardSigner
	if o.cardSigningDir != "" {
		if signer, err = gateway.NewCardSigner(o.cardSigningDir); err != nil {
			return fmt.Errorf("--card-signing-dir: %w", err)
		}
	}
	in := gateway.NewInbound(gateway.InboundConfig{CardKeysAgent: keysAgent, CardSigner: signer, Directory: dir, Auth: reviewer, Pool: pool,
		BrokerURL: o.brokerURL, PublicURL: o.publicURL, MaxBodyBytes: o.maxBody, Ring: ring, Logger: log})
	ocfg := gateway.OutboundConfig{Conn: conn, Directory: dir, Ring: ring}
	if o.cardStatus {
		if ocfg.Status, err = client.New(restCfg, client.Options{Scheme: gateway.NewScheme()}); err != nil {
			return fmt.Errorf("status client: %w", err)
		}
	}
	out := gateway.NewOutbound(ocfg)
	if ring != nil {
		ring.Follow(ctx, pool, out)
		go ring.Run(ctx)
	}
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
