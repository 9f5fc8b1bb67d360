-- A TOTP code signs in once. The code of a 30-second step stays valid for about 90 s (one step of
-- clock drift either way), so a code seen over someone's shoulder, or replayed from a proxy log,
-- would otherwise sign in again within that window. Each user's last accepted step is kept, and a
-- sign-in is accepted only with a later step.
alter table crm.user_totp add column last_used_step bigint;
comment on column crm.user_totp.last_used_step is 'The RFC 6238 time step of the last code accepted at sign-in; a code of this step or an earlier one is refused.';

create function crm.tg_user_totp__steps_only_forward() returns trigger
language plpgsql
as $$
begin
  if old.last_used_step is not null and (new.last_used_step is null or new.last_used_step <= old.last_used_step) then
    raise exception 'a TOTP step is used once: % is not after %', new.last_used_step, old.last_used_step
      using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return new;
end
$$;
create trigger tg_user_totp__steps_only_forward before update of last_used_step on crm.user_totp
  for each row execute function crm.tg_user_totp__steps_only_forward();
comment on function crm.tg_user_totp__steps_only_forward() is 'Refuses moving last_used_step back or setting it again to the same step: a code is accepted once.';
