-- A CSV text cell in one function: the formula guard of API.md section 6 and the RFC 4180 quoting.
-- An export writes every text cell through it. Kept as one SQL function whose parameter is the
-- column itself, PostgreSQL inlines it into the export's query. crm.csv_cell wrapped around a CASE
-- would not be: PostgreSQL does not inline a SQL function whose repeated parameter receives a costly
-- argument, and a call per cell halves the CSV export (measured at 300,000 deals: 54 % of the bare
-- cursor against 98 % for this function; docs/performance.md).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create function crm.csv_text_cell(value text) returns text
language sql immutable parallel safe
as $$
  -- strpos, not a regular expression, as in crm.csv_cell.
  select case
    when value is null then ''
    when left(value, 1) in ('=', '+', '-', '@', E'\t', E'\r') then
      case
        when strpos(value, '"') > 0 or strpos(value, ',') > 0 or strpos(value, E'\n') > 0 or strpos(value, E'\r') > 0
          then '"''' || replace(value, '"', '""') || '"'
        else '''' || value
      end
    when strpos(value, '"') > 0 or strpos(value, ',') > 0 or strpos(value, E'\n') > 0 or strpos(value, E'\r') > 0
      then '"' || replace(value, '"', '""') || '"'
    else value
  end
$$;
comment on function crm.csv_text_cell(text) is
  'One CSV text cell: a leading '' before =, +, -, @, a tab or a carriage return (a spreadsheet would run it as a formula), then RFC 4180 quoting; null is empty.';
revoke execute on function crm.csv_text_cell(text) from public;
grant execute on function crm.csv_text_cell(text) to crm_api;
