-- ops.elementwise: placeholder until its family lands.
return function() end
