package telemetry

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// received collects the spans an OTLP receiver got: (service.name, span name) pairs.
type received struct {
	mu    sync.Mutex
	spans [][2]string
}

func (r *received) add(req *coltrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, [2]string{service, s.GetName()})
			}
		}
	}
}

func (r *received) has(service, span string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if s == [2]string{service, span} {
			return true
		}
	}
	return false
}

// restoreGlobal puts the global tracer provider back after a test that installed one.
func restoreGlobal(t *testing.T) {
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
}

func clearEnv(t *testing.T) {
	for _, k := range []string{EnvEndpoint, EnvTracesEndpoint, EnvProtocol, EnvTracesProtocol, EnvTracesExporter, EnvSDKDisabled, "OTEL_SERVICE_NAME"} {
		t.Setenv(k, "")
	}
}

func TestOffByDefault(t *testing.T) {
	clearEnv(t)
	restoreGlobal(t)
	before := otel.GetTracerProvider()
	shutdown, err := Setup(context.Background(), "svc")
	if err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Fatal("Setup without an endpoint replaced the global tracer provider")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvEndpoint, "http://127.0.0.1:1")
	t.Setenv(EnvTracesExporter, "none")
	if Enabled() {
		t.Fatal("OTEL_TRACES_EXPORTER=none still enabled")
	}
	t.Setenv(EnvTracesExporter, "")
	t.Setenv(EnvSDKDisabled, "true")
	if Enabled() {
		t.Fatal("OTEL_SDK_DISABLED=true still enabled")
	}
}

func TestRejectsUnknownSettings(t *testing.T) {
	clearEnv(t)
	restoreGlobal(t)
	t.Setenv(EnvEndpoint, "http://127.0.0.1:1")
	t.Setenv(EnvProtocol, "http/json")
	if _, err := Setup(context.Background(), "svc"); err == nil {
		t.Fatal("http/json accepted")
	}
	t.Setenv(EnvProtocol, "")
	t.Setenv(EnvTracesExporter, "zipkin")
	if _, err := Setup(context.Background(), "svc"); err == nil {
		t.Fatal("OTEL_TRACES_EXPORTER=zipkin accepted")
	}
}

// TestOTLPHTTP exports to a real OTLP/HTTP receiver (protobuf over HTTP on loopback).
func TestOTLPHTTP(t *testing.T) {
	clearEnv(t)
	restoreGlobal(t)
	got := &received{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got.add(&req)
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	t.Setenv(EnvEndpoint, srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	shutdown, err := Setup(context.Background(), "default-name")
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(context.Background(), "exported over http")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !got.has("from-env", "exported over http") {
		t.Fatalf("receiver got %v", got.spans)
	}
}

type grpcReceiver struct {
	coltrace.UnimplementedTraceServiceServer
	got *received
}

func (g grpcReceiver) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	g.got.add(req)
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// TestOTLPGRPC exports to a real OTLP/gRPC receiver on loopback.
func TestOTLPGRPC(t *testing.T) {
	clearEnv(t)
	restoreGlobal(t)
	got := &received{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(gs, grpcReceiver{got: got})
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	t.Setenv(EnvEndpoint, "http://"+ln.Addr().String())
	t.Setenv(EnvProtocol, "grpc")
	shutdown, err := Setup(context.Background(), "grpc-service")
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(context.Background(), "exported over grpc")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !got.has("grpc-service", "exported over grpc") {
		t.Fatalf("receiver got %v", got.spans)
	}
}
