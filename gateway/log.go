package gateway

import (
	"errors"
	"os"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger builds the zap logger from SLUICE_LOG_LEVEL, SLUICE_LOG_FORMAT
// and SLUICE_ACCESS_LOG, writing to stderr.
func newLogger(cfg *config) *zap.Logger {
	return buildLogger(cfg, zapcore.Lock(os.Stderr))
}

// buildLogger is newLogger writing to out. It is zap's production logger
// (JSON, sampled: of the lines with one level and message, the first 100
// of each second and every 100th after them), or its development logger
// for SLUICE_LOG_FORMAT=console, at SLUICE_LOG_LEVEL. The access log's
// lines (logger "access") are written whatever the level and never
// sampled: they all share one message, and an access log that keeps one
// line in a hundred is no access log.
func buildLogger(cfg *config, out zapcore.WriteSyncer) *zap.Logger {
	encCfg := zap.NewProductionEncoderConfig()
	stackAt := zapcore.ErrorLevel
	if cfg.LogFormat == "console" {
		encCfg = zap.NewDevelopmentEncoderConfig()
		stackAt = zapcore.WarnLevel
	}
	encCfg.TimeKey = "time"
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	enc := zapcore.NewJSONEncoder(encCfg)
	if cfg.LogFormat == "console" {
		enc = zapcore.NewConsoleEncoder(encCfg)
	}
	core := zapcore.NewCore(enc, out, zap.NewAtomicLevelAt(cfg.logLevel))
	opts := []zap.Option{zap.AddCaller(), zap.ErrorOutput(zapcore.Lock(os.Stderr))}
	if cfg.LogFormat == "console" {
		opts = append(opts, zap.Development())
	} else {
		core = zapcore.NewSamplerWithOptions(core, time.Second, 100, 100)
	}
	if cfg.logLevel <= zapcore.DebugLevel {
		opts = append(opts, zap.AddStacktrace(stackAt))
	}
	if cfg.AccessLog {
		core = accessSplit{rest: core, access: zapcore.NewCore(enc.Clone(), out, zapcore.InfoLevel)}
	}
	return zap.New(core, opts...)
}

// accessLoggerName is the name of the access log's logger.
const accessLoggerName = "access"

// accessSplit sends the entries of the access logger to access and every
// other entry to rest.
type accessSplit struct{ rest, access zapcore.Core }

func (c accessSplit) Enabled(l zapcore.Level) bool {
	return c.rest.Enabled(l) || c.access.Enabled(l)
}

func (c accessSplit) With(fields []zapcore.Field) zapcore.Core {
	return accessSplit{rest: c.rest.With(fields), access: c.access.With(fields)}
}

func (c accessSplit) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.LoggerName == accessLoggerName {
		return c.access.Check(e, ce)
	}
	return c.rest.Check(e, ce)
}

// Write is never called: Check hands each entry to the core that writes
// it. It writes to rest should a caller write directly.
func (c accessSplit) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.rest.Write(e, fields)
}

func (c accessSplit) Sync() error {
	return errors.Join(c.rest.Sync(), c.access.Sync())
}
