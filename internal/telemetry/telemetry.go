// Package telemetry sets up OpenTelemetry tracing for a2a-fleet's binaries (the example agents,
// a2actl, the conversation service, the operator, devstack) from the standard OTEL_* environment.
//
// Tracing is off by default: without an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) nothing is set up, the global tracer provider stays
// OpenTelemetry's no-op and the SDK's spans cost next to nothing. With one, spans are batched to
// an OTLP exporter (http/protobuf by default, grpc with OTEL_EXPORTER_OTLP_PROTOCOL=grpc), the
// W3C trace-context propagator is installed, and the exporter reads the rest of its settings
// (headers, TLS, timeout, sampler) from the same standard variables.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Standard OpenTelemetry environment variables this package reads itself (the exporters read
// their own OTEL_EXPORTER_OTLP_* settings).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
)

// Shutdown flushes and stops what Setup started (a no-op when tracing is off).
type Shutdown func(context.Context) error

// Enabled reports whether the environment asks for trace export.
func Enabled() bool {
	if disabled, _ := strconv.ParseBool(os.Getenv(EnvSDKDisabled)); disabled {
		return false
	}
	if strings.TrimSpace(os.Getenv(EnvTracesExporter)) == "none" {
		return false
	}
	return os.Getenv(EnvEndpoint) != "" || os.Getenv(EnvTracesEndpoint) != ""
}

// Setup installs a global tracer provider exporting over OTLP when the environment configures an
// endpoint (see the package doc), with service.name defaulting to serviceName
// (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it). Without one it changes nothing
// and returns a no-op Shutdown. Call the returned Shutdown before the process exits so the last
// spans are flushed.
func Setup(ctx context.Context, serviceName string) (Shutdown, error) {
	noop := func(context.Context) error { return nil }
	if !Enabled() {
		return noop, nil
	}
	if exp := strings.TrimSpace(os.Getenv(EnvTracesExporter)); exp != "" && exp != "otlp" {
		return noop, fmt.Errorf("telemetry: %s=%q is not supported (use otlp or none)", EnvTracesExporter, exp)
	}
	protocol := os.Getenv(EnvTracesProtocol)
	if protocol == "" {
		protocol = os.Getenv(EnvProtocol)
	}
	var exporter sdktrace.SpanExporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		return noop, fmt.Errorf("telemetry: %s=%q is not supported (use http/protobuf or grpc)", EnvProtocol, protocol)
	}
	if err != nil {
		return noop, fmt.Errorf("telemetry: create OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", serviceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win over the default
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exporter.Shutdown(ctx)
		return noop, fmt.Errorf("telemetry: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}
