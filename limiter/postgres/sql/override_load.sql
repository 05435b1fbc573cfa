SELECT rule, key, "limit", window_us FROM {{schema}}.overrides
