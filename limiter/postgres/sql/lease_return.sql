-- Gives back leased units that were not spent (see return_leases in
-- lease_functions.sql); returns how many leases changed a counter.
SELECT {{schema}}.return_leases(
    $1::text[],      -- rule
    $2::text[],      -- key
    $3::smallint[],  -- algorithm
    $4::bigint[],    -- mark
    $5::bigint[],    -- bucket µs (sliding)
    $6::bigint[],    -- unused units
    $7::bigint[]     -- settled units
)
