package limiter

// The options of this package and of its stores (Config, BreakerConfig,
// memory.Options, postgres.Options) follow one convention: the zero value
// of a field means its default, an exported Default… constant of the
// field's package that the field's comment names; a field that can be
// turned off is turned off by Off, and any other negative value of it is
// invalid.

// Off is the value that turns off an option which can be off: a duration,
// a count or a ratio set to Off is off. It is not zero because zero means
// the option's default. Settings read from the environment, where 0 means
// off, are turned into Off by the gateway.
const Off = -1
